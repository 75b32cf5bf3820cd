//! Integer fields as the OpenAPI document's `integer` reads them: JSON does not tell `1.0`
//! from `1`, so a whole number written with a fraction or an exponent is that integer (within
//! 64 bits). Only integer fields of request bodies use these; free-form JSON is kept as sent.

use serde::de::{self, Deserialize, Deserializer, Unexpected, Visitor};

struct NonNegative;

impl Visitor<'_> for NonNegative {
    type Value = u64;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a non-negative integer")
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
        Ok(v)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
        u64::try_from(v).map_err(|_| E::invalid_value(Unexpected::Signed(v), &self))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<u64, E> {
        const TWO_64: f64 = 18_446_744_073_709_551_616.0;
        if v.fract() == 0.0 && (0.0..TWO_64).contains(&v) {
            // Whole and in range: exact.
            Ok(v as u64)
        } else {
            Err(E::invalid_type(Unexpected::Float(v), &self))
        }
    }
}

/// A JSON number as a `u64` when it is a whole number in range, written either way.
pub fn from_number(n: &serde_json::Number) -> Option<u64> {
    n.as_u64().or_else(|| {
        n.as_f64()
            .and_then(|f| NonNegative.visit_f64::<de::value::Error>(f).ok())
    })
}

/// A `u64` read leniently (see the module).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Whole(pub u64);

impl<'de> Deserialize<'de> for Whole {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NonNegative).map(Whole)
    }
}

pub fn u64<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    Whole::deserialize(d).map(|w| w.0)
}

pub fn opt_u64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    Option::<Whole>::deserialize(d).map(|o| o.map(|w| w.0))
}

/// For a field where `null` clears and absence keeps (with `#[serde(default)]`).
pub fn nullable_u64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<u64>>, D::Error> {
    Option::<Whole>::deserialize(d).map(|o| Some(o.map(|w| w.0)))
}

pub fn vec_u64<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u64>, D::Error> {
    Vec::<Whole>::deserialize(d).map(|v| v.into_iter().map(|w| w.0).collect())
}

pub fn opt_vec_u64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u64>>, D::Error> {
    Option::<Vec<Whole>>::deserialize(d).map(|o| o.map(|v| v.into_iter().map(|w| w.0).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    struct B {
        #[serde(deserialize_with = "u64")]
        id: u64,
        #[serde(default, deserialize_with = "opt_vec_u64")]
        ids: Option<Vec<u64>>,
    }

    #[test]
    fn whole_numbers_in_any_spelling_and_nothing_else() {
        let b: B = serde_json::from_str(r#"{"id": 7.0, "ids": [1, 2e0, 3.0]}"#).unwrap();
        assert_eq!((b.id, b.ids), (7, Some(vec![1, 2, 3])));
        let b: B = serde_json::from_str(r#"{"id": 18446744073709551615}"#).unwrap();
        assert_eq!((b.id, b.ids), (u64::MAX, None));
        for bad in ["7.5", "-1", "-1.0", "1e20", "\"7\"", "null", "true"] {
            let r = serde_json::from_str::<B>(&format!(r#"{{"id": {bad}}}"#));
            assert!(r.is_err(), "{bad}");
        }
    }
}
