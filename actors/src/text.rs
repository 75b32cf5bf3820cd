//! Text shaping shared by the rules and the actors: leaf helpers with no state.

/// At most `max` characters, then `...` when cut (messages and logs quote untrusted values).
pub fn clip(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}...", s.get(..i).unwrap_or_default()),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::clip;

    #[test]
    fn clips_at_a_character_not_a_byte() {
        assert_eq!(clip("abc", 3), "abc");
        assert_eq!(clip("abcd", 3), "abc...");
        assert_eq!(clip("ééé", 2), "éé...");
        assert_eq!(clip("", 0), "");
    }
}
