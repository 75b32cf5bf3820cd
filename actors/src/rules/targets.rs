//! Which outbound targets an integration may name: absolute http(s) URLs, and (unless the
//! operator allows it) no address on loopback or a private network. Checked on the URL's
//! literal host at create and patch, and again on every resolved address at send time.

use std::net::{IpAddr, Ipv4Addr};

use crate::error::{Error, Result};

/// Whether `ip` is one of the refused ranges: loopback, RFC 1918, link-local
/// (169.254/16, fe80::/10), unique-local (fc00::/7), CGNAT (100.64/10), unspecified,
/// broadcast, and the IPv4-mapped and IPv4-compatible forms of them.
pub fn is_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => private_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return private_v4(v4);
            }
            let s = v6.segments();
            // ::a.b.c.d (deprecated IPv4-compatible) names an IPv4 host as well.
            if s[..6] == [0; 6] && !v6.is_unspecified() && !v6.is_loopback() {
                return private_v4(Ipv4Addr::new(
                    (s[6] >> 8) as u8,
                    s[6] as u8,
                    (s[7] >> 8) as u8,
                    s[7] as u8,
                ));
            }
            let embedded = |hi: u16, lo: u16| {
                Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8)
            };
            // NAT64 (64:ff9b::/96) and 6to4 (2002::/16) carry an IPv4 address inside.
            if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                return private_v4(embedded(s[6], s[7]));
            }
            if s[0] == 0x2002 {
                return private_v4(embedded(s[1], s[2]));
            }
            v6.is_loopback()
                || v6.is_unspecified()
                || (s[0] & 0xfe00) == 0xfc00
                || (s[0] & 0xffc0) == 0xfe80
                // Site-local (deprecated, still routed privately) and local-use NAT64.
                || (s[0] & 0xffc0) == 0xfec0
                || (s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1)
        }
    }
}

fn private_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || a == 0
        || (a == 100 && (b & 0xc0) == 64)
}

/// A host that names the local machine without being an address.
fn is_local_name(host: &str) -> bool {
    let h = host.trim_end_matches('.').to_ascii_lowercase();
    h == "localhost" || h.ends_with(".localhost")
}

/// Parses an absolute http(s) URL with a host; with `allow_private` false, refuses one whose
/// host is a refused address or `localhost`. Names that only resolve to such addresses are
/// caught at send time.
pub fn outbound_url(field: &str, s: &str, allow_private: bool) -> Result<url::Url> {
    let u = url::Url::parse(s.trim())
        .map_err(|_| Error::unprocessable(field, "must be an absolute http or https URL"))?;
    if !matches!(u.scheme(), "http" | "https") {
        return Err(Error::unprocessable(
            field,
            "must be an absolute http or https URL",
        ));
    }
    let Some(host) = u.host() else {
        return Err(Error::unprocessable(field, "must name a host"));
    };
    if !u.username().is_empty() || u.password().is_some() {
        return Err(Error::unprocessable(
            field,
            "must not carry credentials in the URL",
        ));
    }
    if !allow_private {
        let refused = match host {
            url::Host::Ipv4(ip) => is_private(IpAddr::V4(ip)),
            url::Host::Ipv6(ip) => is_private(IpAddr::V6(ip)),
            url::Host::Domain(d) => is_local_name(d),
        };
        if refused {
            return Err(Error::unprocessable(
                field,
                "targets a loopback or private address (set [alerts] allow_private_targets to allow)",
            ));
        }
    }
    Ok(u)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_ranges() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.254",
            "0.0.0.0",
            "::1",
            "::",
            "fc00::1",
            "fd12::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b::a00:1",
            "64:ff9b:1::1",
            "2002:a00:1::1",
            "2002:7f00:1::",
            "fec0::1",
        ] {
            assert!(is_private(ip.parse().unwrap()), "{ip}");
        }
        for ip in [
            "8.8.8.8",
            "100.128.0.1",
            "100.63.255.255",
            "2606:4700::1111",
            "::ffff:1.1.1.1",
        ] {
            assert!(!is_private(ip.parse().unwrap()), "{ip}");
        }
    }

    #[test]
    fn urls() {
        assert!(outbound_url("u", "https://hooks.slack.com/services/x", false).is_ok());
        for bad in [
            "ftp://example.com",
            "/relative",
            "example.com",
            "http://localhost:9000/x",
            "http://sink.localhost/x",
            "http://127.0.0.1/x",
            "http://[::1]/x",
            "http://[::ffff:7f00:1]/x",
            "http://10.0.0.1/x",
            "http://user:pw@example.com/",
        ] {
            assert!(outbound_url("u", bad, false).is_err(), "{bad}");
        }
        assert!(outbound_url("u", "http://127.0.0.1:9000/x", true).is_ok());
        assert!(outbound_url("u", "ftp://127.0.0.1/x", true).is_err());
    }
}
