//! Percent-encoding of query values and form fields, shared by the console (links with
//! filters) and the server (sign-in form, redirects).

/// Percent-encodes everything but unreserved characters (RFC 3986), so the result is safe
/// in a query value, a form field or a path segment.
pub fn encode(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Decodes `application/x-www-form-urlencoded` text (`+` is a space); a malformed escape
/// is kept as it is.
pub fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The value of `name` in form-encoded `body`, decoded.
pub fn form_field(body: &str, name: &str) -> Option<String> {
    body.split('&')
        .filter_map(|p| p.split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| decode(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_decodes_forms() {
        let raw = "a b/c?d=é&%";
        assert_eq!(decode(&encode(raw)), raw);
        assert_eq!(decode("a%20b+c%2F%zz"), "a b c/%zz");
        assert_eq!(
            form_field("username=al%40ice&password=p+w", "username").as_deref(),
            Some("al@ice")
        );
        assert_eq!(form_field("username=x", "password"), None);
    }
}
