//! Which outbound targets an integration may name: absolute http(s) URLs, and (unless the
//! operator allows it) no address in a special-purpose range (loopback, private networks,
//! and every other range of IANA's IPv4 and IPv6 special-purpose registries, multicast). Checked on the URL's
//! literal host at create and patch, and again on every resolved address at send time.

use std::net::{IpAddr, Ipv4Addr};

use crate::error::{Error, Result};

/// Whether `ip` is refused as an outbound target: every range of IANA's IPv4 and IPv6
/// Special-Purpose Address Registries (loopback, private, shared, link-local, documentation,
/// benchmarking, protocol assignments, reserved, broadcast, discard, AS112, AMT, SRv6,
/// unique-local, site-local) and multicast. The forms that carry an IPv4 address to reach it
/// (IPv4-mapped `::ffff:0:0/96`, NAT64's well-known `64:ff9b::/96`, 6to4 `2002::/16`) are
/// judged by the address they carry; the others (IPv4-compatible `::/96`, IPv4-translated
/// `::ffff:0:0:0/96`, local-use NAT64 `64:ff9b:1::/48`) are refused whole.
pub fn is_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => private_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return private_v4(v4);
            }
            let s = v6.segments();
            let embedded = |hi: u16, lo: u16| {
                Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8)
            };
            // NAT64 (64:ff9b::/96) and 6to4 (2002::/16) reach the IPv4 address they carry.
            if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                return private_v4(embedded(s[6], s[7]));
            }
            if s[0] == 0x2002 {
                return private_v4(embedded(s[1], s[2]));
            }
            // ::/96: unspecified, loopback and the deprecated IPv4-compatible addresses.
            s[..6] == [0; 6]
                // IPv4-translated (::ffff:0:a.b.c.d).
                || s[..6] == [0, 0, 0, 0, 0xffff, 0]
                // Local-use NAT64.
                || (s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1)
                // Discard-only and dummy prefixes (100::/64, 100:0:0:1::/64).
                || (s[0] == 0x100 && s[1] == 0 && s[2] == 0 && s[3] <= 1)
                // IETF protocol assignments (2001::/23: Teredo, benchmarking, ORCHID, AMT,
                // AS112...) and documentation (2001:db8::/32, 3fff::/20).
                || (s[0] == 0x2001 && s[1] < 0x200)
                || (s[0] == 0x2001 && s[1] == 0xdb8)
                || (s[0] == 0x3fff && s[1] < 0x1000)
                // AS112 direct delegation, SRv6 SIDs.
                || (s[0] == 0x2620 && s[1] == 0x4f && s[2] == 0x8000)
                || s[0] == 0x5f00
                // Unique-local, link-local, site-local (deprecated), multicast.
                || (s[0] & 0xfe00) == 0xfc00
                || (s[0] & 0xffc0) == 0xfe80
                || (s[0] & 0xffc0) == 0xfec0
                || (s[0] & 0xff00) == 0xff00
        }
    }
}

fn private_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    match a {
        // "This network", private, loopback.
        0 | 10 | 127 => true,
        // Shared address space (CGNAT).
        100 => (b & 0xc0) == 64,
        169 => b == 254,
        172 => (b & 0xf0) == 16,
        // IETF protocol assignments, documentation (TEST-NET-1), AS112, AMT, the 6to4 relay
        // anycast, private, AS112 direct delegation.
        192 => {
            matches!(
                (b, c),
                (0, 0) | (0, 2) | (31, 196) | (52, 193) | (88, 99) | (175, 48)
            ) || b == 168
        }
        // Benchmarking (198.18/15), documentation (TEST-NET-2).
        198 => (b & 0xfe) == 18 || (b == 51 && c == 100),
        // Documentation (TEST-NET-3).
        203 => b == 0 && c == 113,
        // Multicast (224/4), reserved (240/4) and the limited broadcast address.
        224..=255 => true,
        _ => false,
    }
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
                "targets a loopback, private or special-purpose address (set [alerts] allow_private_targets to allow)",
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
            // IANA's special-purpose registries beyond the private ranges.
            "192.0.0.1",
            "192.0.0.170",
            "192.0.2.10",
            "192.31.196.1",
            "192.52.193.1",
            "192.88.99.1",
            "192.175.48.1",
            "198.18.0.1",
            "198.19.255.255",
            "198.51.100.7",
            "203.0.113.9",
            "224.0.0.1",
            "239.255.255.250",
            "240.0.0.1",
            "255.255.255.255",
            "::ffff:0:127.0.0.1",
            "::ffff:0:8.8.8.8",
            "::8.8.8.8",
            "100::1",
            "100:0:0:1::1",
            "2001::1",
            "2001:2::1",
            "2001:20::1",
            "2001:1ff::1",
            "2001:db8::1",
            "3fff::1",
            "2620:4f:8000::1",
            "5f00::1",
            "ff02::1",
            "ff0e::1",
            "64:ff9b::c000:201",
            "2002:c000:201::1",
            "::ffff:224.0.0.1",
        ] {
            assert!(is_private(ip.parse().unwrap()), "{ip}");
        }
        for ip in [
            "8.8.8.8",
            "100.128.0.1",
            "100.63.255.255",
            "2606:4700::1111",
            "::ffff:1.1.1.1",
            "64:ff9b::808:808",
            "2002:808:808::1",
            "192.0.1.1",
            "192.0.3.1",
            "198.17.255.255",
            "198.20.0.1",
            "203.0.112.1",
            "223.255.255.255",
            "2001:200::1",
            "2001:db9::1",
            "2620:4f:8001::1",
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
