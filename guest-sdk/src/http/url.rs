//! The URLs [`http`](super) sends to: parsed just far enough to hand
//! `wasi:http` its scheme, authority and path with query.

use std::fmt;
use std::net::Ipv6Addr;
use std::str::FromStr;

use super::Error;

/// An absolute `http` or `https` URL, checked and normalised.
///
/// The scheme and host are lowercased, a port equal to the scheme's default is
/// dropped, `.` and `..` segments are folded, the fragment is dropped (it never
/// travels in a request), and characters a request line cannot carry (spaces,
/// non-ASCII, `"<>` and the like) are percent-encoded. URLs with credentials
/// (`user:pass@host`) are refused: send credentials in a header.
///
/// ```
/// use keel_guest::http::Url;
///
/// let url = Url::parse("HTTPS://Example.com:443/a/./b/../c d?q=1#top").unwrap();
/// assert_eq!(url.to_string(), "https://example.com/a/c%20d?q=1");
/// assert_eq!(url.origin(), "https://example.com");
/// assert_eq!(url.path_and_query(), "/a/c%20d?q=1");
///
/// let error = Url::parse("example.com/docs").unwrap_err();
/// assert_eq!(
///     error.to_string(),
///     "invalid URL `example.com/docs`: it has no scheme; write it in full, such as \
///      `https://example.com/docs`"
/// );
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Url {
    https: bool,
    /// Lowercased; an IPv6 address keeps its brackets.
    host: String,
    /// `None` when absent or the scheme's default.
    port: Option<u16>,
    /// Starts with `/`.
    path_and_query: String,
}

impl Url {
    /// Parse an absolute `http` or `https` URL; surrounding whitespace is
    /// ignored. The error says what is wrong with it.
    pub fn parse(input: &str) -> Result<Url, Error> {
        let trimmed = input.trim();
        parse(trimmed).map_err(|reason| Error::InvalidUrl { url: trimmed.to_string(), reason })
    }

    /// Resolve `reference` (a `Location` header, a link) against this URL, as
    /// a browser does: an absolute URL stands alone, `//host/x` keeps the
    /// scheme, `/x` the origin, `?q` the path, and `x` is relative to the
    /// path's directory.
    ///
    /// ```
    /// use keel_guest::http::Url;
    ///
    /// let base = Url::parse("https://example.com/docs/intro?page=2").unwrap();
    /// assert_eq!(base.join("setup").unwrap().to_string(), "https://example.com/docs/setup");
    /// assert_eq!(base.join("../about").unwrap().to_string(), "https://example.com/about");
    /// assert_eq!(base.join("/").unwrap().to_string(), "https://example.com/");
    /// assert_eq!(base.join("?page=3").unwrap().to_string(), "https://example.com/docs/intro?page=3");
    /// assert_eq!(base.join("//cdn.example.com/x").unwrap().to_string(), "https://cdn.example.com/x");
    /// assert_eq!(base.join("http://other.org").unwrap().to_string(), "http://other.org/");
    /// ```
    pub fn join(&self, reference: &str) -> Result<Url, Error> {
        let reference = reference.trim();
        let absolute = if has_scheme(reference) {
            reference.to_string()
        } else if reference.starts_with("//") {
            format!("{}:{reference}", self.scheme())
        } else {
            let reference = reference.split('#').next().unwrap_or_default();
            let (path, _) = split_query(&self.path_and_query);
            let joined = if reference.is_empty() {
                self.path_and_query.clone()
            } else if reference.starts_with('/') {
                reference.to_string()
            } else if reference.starts_with('?') {
                format!("{path}{reference}")
            } else {
                let directory = &path[..path.rfind('/').map_or(0, |slash| slash + 1)];
                format!("{directory}{reference}")
            };
            format!("{}{joined}", self.origin())
        };
        Url::parse(&absolute)
    }

    /// `http` or `https`.
    pub fn scheme(&self) -> &'static str {
        if self.https { "https" } else { "http" }
    }

    /// The host, lowercased: a name, an IPv4 address, or an IPv6 address in
    /// brackets (`[::1]`).
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port the request goes to: the one written, or the scheme's
    /// default (80 or 443).
    pub fn port(&self) -> u16 {
        self.port.unwrap_or(if self.https { 443 } else { 80 })
    }

    /// The host and, when it is not the scheme's default, the port:
    /// `example.com`, `localhost:8080`.
    pub fn authority(&self) -> String {
        match self.port {
            Some(port) => format!("{}:{port}", self.host),
            None => self.host.clone(),
        }
    }

    /// `scheme://authority`: what a browser calls the origin, and what a
    /// permission rule for a site matches.
    pub fn origin(&self) -> String {
        format!("{}://{}", self.scheme(), self.authority())
    }

    /// The path and the query, if any: `/search?q=wasm`. Always starts with
    /// `/`.
    pub fn path_and_query(&self) -> &str {
        &self.path_and_query
    }
}

impl fmt::Display for Url {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.origin(), self.path_and_query)
    }
}

impl FromStr for Url {
    type Err = Error;

    fn from_str(input: &str) -> Result<Url, Error> {
        Url::parse(input)
    }
}

fn parse(input: &str) -> Result<Url, String> {
    // `localhost:8080/x` is a host and a port, not the scheme `localhost`.
    let scheme = input
        .split_once(':')
        .filter(|(scheme, rest)| is_scheme(scheme) && !rest.starts_with(|c: char| c.is_ascii_digit()));
    let Some((scheme, rest)) = scheme else {
        return Err(match input {
            "" => "it is empty".to_string(),
            _ if input.starts_with('/') && !input.starts_with("//") => {
                format!("it is a path, not a URL; write it in full, such as `https://example.com{input}`")
            }
            _ => format!(
                "it has no scheme; write it in full, such as `https://{}`",
                input.strip_prefix("//").unwrap_or(input)
            ),
        });
    };
    let https = match scheme.to_ascii_lowercase().as_str() {
        "http" => false,
        "https" => true,
        _ => return Err(format!("the scheme `{scheme}` is not supported; only http and https are")),
    };
    let Some(rest) = rest.strip_prefix("//") else {
        return Err(format!("`{scheme}:` must be followed by `//` and the host"));
    };
    let authority_end = rest.find(['/', '?', '#', '\\']).unwrap_or(rest.len());
    let (authority, rest) = rest.split_at(authority_end);
    if rest.starts_with('\\') {
        return Err("a `\\` cannot follow the host; use `/`".to_string());
    }
    if authority.contains('@') {
        return Err("credentials (`user@`) in a URL are not supported; send them in a header".to_string());
    }
    let (host, port) = split_port(authority)?;
    let host = parse_host(host)?;
    let default_port = if https { 443 } else { 80 };
    let port = port.filter(|&port| port != default_port);

    let rest = rest.split('#').next().unwrap_or_default();
    let (path, query) = split_query(rest);
    let path = if path.is_empty() { "/".to_string() } else { remove_dot_segments(&encode(path)) };
    let path_and_query = match query {
        Some(query) => format!("{path}?{}", encode(query)),
        None => path,
    };
    Ok(Url { https, host, port, path_and_query })
}

/// Whether `reference` starts with a scheme and its `:`.
fn has_scheme(reference: &str) -> bool {
    reference.split_once(':').is_some_and(|(scheme, _)| is_scheme(scheme))
}

/// RFC 3986: a letter, then letters, digits, `+`, `-` and `.`.
fn is_scheme(scheme: &str) -> bool {
    let mut chars = scheme.chars();
    chars.next().is_some_and(|first| first.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

fn split_query(path_and_query: &str) -> (&str, Option<&str>) {
    match path_and_query.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (path_and_query, None),
    }
}

/// Split `host[:port]`; an empty port (`host:`) is no port.
fn split_port(authority: &str) -> Result<(&str, Option<u16>), String> {
    let (host, port) = if authority.starts_with('[') {
        match authority.find(']') {
            Some(end) => (&authority[..=end], &authority[end + 1..]),
            None => return Err(format!("the IPv6 address in `{authority}` has no closing `]`")),
        }
    } else {
        match authority.rfind(':') {
            Some(colon) => (&authority[..colon], &authority[colon..]),
            None => (authority, ""),
        }
    };
    let port = match port {
        "" | ":" => None,
        port => match port.strip_prefix(':') {
            Some(digits) if digits.bytes().all(|b| b.is_ascii_digit()) => match digits.parse::<u16>() {
                Ok(port) if port > 0 => Some(port),
                _ => return Err(format!("the port `{digits}` is not a number from 1 to 65535")),
            },
            Some(digits) => return Err(format!("the port `{digits}` is not a number from 1 to 65535")),
            None => return Err(format!("`{port}` cannot follow the IPv6 address; write `[address]:port`")),
        },
    };
    Ok((host, port))
}

fn parse_host(host: &str) -> Result<String, String> {
    if host.is_empty() {
        return Err("it has no host".to_string());
    }
    if let Some(address) = host.strip_prefix('[').and_then(|host| host.strip_suffix(']')) {
        return match Ipv6Addr::from_str(address) {
            Ok(_) => Ok(host.to_ascii_lowercase()),
            Err(_) => Err(format!("`{host}` is not a valid IPv6 address")),
        };
    }
    if !host.is_ascii() {
        return Err(format!("the host `{host}` is not ASCII; write it in its punycode form (`xn--…`)"));
    }
    if let Some(bad) = host.chars().find(|&c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))) {
        return Err(format!("the host `{host}` has a character a host name cannot have: `{bad}`"));
    }
    Ok(host.to_ascii_lowercase())
}

/// Percent-encode every byte outside RFC 3986's unreserved and reserved sets,
/// and a `%` that does not start an escape: what is left is what any HTTP
/// stack accepts in a request line. Escapes already there are kept.
fn encode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    for (at, &byte) in bytes.iter().enumerate() {
        let escape = byte == b'%'
            && bytes.get(at + 1).is_some_and(u8::is_ascii_hexdigit)
            && bytes.get(at + 2).is_some_and(u8::is_ascii_hexdigit);
        let kept = byte.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/?".contains(&byte) || escape;
        if kept {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Fold `.` and `..` segments of an absolute path (RFC 3986 §5.2.4); `..`
/// never climbs above `/`.
fn remove_dot_segments(path: &str) -> String {
    let mut kept: Vec<&str> = Vec::new();
    // A path that ends in a dot segment names a directory: it keeps a `/`.
    let mut directory = false;
    for segment in path.split('/').skip(1) {
        directory = matches!(segment, "." | "..");
        match segment {
            "." => {}
            ".." => {
                kept.pop();
            }
            segment => kept.push(segment),
        }
    }
    let mut out = format!("/{}", kept.join("/"));
    if directory && !kept.is_empty() {
        out.push('/');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(input: &str) -> String {
        Url::parse(input).unwrap_or_else(|error| panic!("{input}: {error}")).to_string()
    }

    fn reason(input: &str) -> String {
        match Url::parse(input) {
            Err(Error::InvalidUrl { reason, .. }) => reason,
            other => panic!("{input}: expected an invalid URL, got {other:?}"),
        }
    }

    #[test]
    fn splits_scheme_authority_and_path_with_query() {
        let parsed = Url::parse("https://example.com:8443/search?q=wasm&lang=en#results").unwrap();
        assert_eq!(parsed.scheme(), "https");
        assert_eq!(parsed.host(), "example.com");
        assert_eq!(parsed.port(), 8443);
        assert_eq!(parsed.authority(), "example.com:8443");
        assert_eq!(parsed.origin(), "https://example.com:8443");
        assert_eq!(parsed.path_and_query(), "/search?q=wasm&lang=en");

        let plain = Url::parse("http://localhost").unwrap();
        assert_eq!((plain.scheme(), plain.port(), plain.authority().as_str()), ("http", 80, "localhost"));
        assert_eq!(plain.path_and_query(), "/");
    }

    #[test]
    fn normalises_case_default_ports_and_dot_segments() {
        assert_eq!(url("HTTP://WWW.Example.COM/Path"), "http://www.example.com/Path");
        assert_eq!(url("http://example.com:80/"), "http://example.com/");
        assert_eq!(url("https://example.com:443"), "https://example.com/");
        assert_eq!(url("http://example.com:443/"), "http://example.com:443/");
        assert_eq!(url("https://example.com:/x"), "https://example.com/x");
        assert_eq!(url("  https://example.com/a  "), "https://example.com/a");
        assert_eq!(url("https://example.com?q"), "https://example.com/?q");
        assert_eq!(url("https://example.com/a/./b/../../c/"), "https://example.com/c/");
        assert_eq!(url("https://example.com/../../x"), "https://example.com/x");
        assert_eq!(url("https://example.com/a/.."), "https://example.com/");
        assert_eq!(url("https://example.com/a/b/."), "https://example.com/a/b/");
        assert_eq!(url("https://example.com/a//b"), "https://example.com/a//b");
        assert_eq!(url("https://example.com/x?a=../b"), "https://example.com/x?a=../b", "the query is kept");
    }

    #[test]
    fn percent_encodes_what_a_request_line_cannot_carry_and_keeps_escapes() {
        assert_eq!(
            url("https://example.com/a b/ü?q=a b&r=\"<x>\""),
            "https://example.com/a%20b/%C3%BC?q=a%20b&r=%22%3Cx%3E%22"
        );
        assert_eq!(url("https://example.com/%41%2f?q=%zz"), "https://example.com/%41%2f?q=%25zz");
        assert_eq!(url("https://example.com/a[1]{2}|^`"), "https://example.com/a%5B1%5D%7B2%7D%7C%5E%60");
        assert_eq!(
            url("https://example.com/~user/(x);y=1,z:@!$&'*+"),
            "https://example.com/~user/(x);y=1,z:@!$&'*+"
        );
    }

    #[test]
    fn accepts_ip_addresses() {
        assert_eq!(url("http://127.0.0.1:8080/x"), "http://127.0.0.1:8080/x");
        let v6 = Url::parse("http://[::1]:3000/").unwrap();
        assert_eq!((v6.host(), v6.port(), v6.authority().as_str()), ("[::1]", 3000, "[::1]:3000"));
        assert_eq!(url("https://[2001:DB8::1]/"), "https://[2001:db8::1]/");
    }

    #[test]
    fn rejects_a_url_without_scheme_or_host_and_says_how_to_write_it() {
        assert_eq!(
            reason("example.com"),
            "it has no scheme; write it in full, such as `https://example.com`"
        );
        assert_eq!(
            reason("localhost:8080/x"),
            "it has no scheme; write it in full, such as `https://localhost:8080/x`"
        );
        assert_eq!(
            reason("//example.com/x"),
            "it has no scheme; write it in full, such as `https://example.com/x`"
        );
        assert_eq!(
            reason("/just/a/path"),
            "it is a path, not a URL; write it in full, such as `https://example.com/just/a/path`"
        );
        assert_eq!(reason("  "), "it is empty");
        assert_eq!(reason("https://"), "it has no host");
        assert_eq!(reason("https:///path"), "it has no host");
        assert_eq!(reason("http://:8080/"), "it has no host");
        assert_eq!(reason("https:example.com"), "`https:` must be followed by `//` and the host");
        let error = Url::parse(" example.com ").unwrap_err();
        assert_eq!(
            error.to_string(),
            "invalid URL `example.com`: it has no scheme; write it in full, such as `https://example.com`"
        );
    }

    #[test]
    fn rejects_schemes_other_than_http_and_https() {
        for (input, scheme) in
            [("ftp://example.com/f", "ftp"), ("file:///etc/passwd", "file"), ("ws://x/", "ws")]
        {
            assert_eq!(
                reason(input),
                format!("the scheme `{scheme}` is not supported; only http and https are")
            );
        }
        assert_eq!(
            reason("mailto:me@example.com"),
            "the scheme `mailto` is not supported; only http and https are"
        );
    }

    #[test]
    fn rejects_bad_hosts_ports_and_credentials() {
        assert_eq!(
            reason("https://user:pw@example.com/"),
            "credentials (`user@`) in a URL are not supported; send them in a header"
        );
        assert_eq!(reason("https://example.com:99999/"), "the port `99999` is not a number from 1 to 65535");
        assert_eq!(reason("https://example.com:0/"), "the port `0` is not a number from 1 to 65535");
        assert_eq!(reason("https://example.com:http/"), "the port `http` is not a number from 1 to 65535");
        assert_eq!(
            reason("https://exa mple.com/"),
            "the host `exa mple.com` has a character a host name cannot have: ` `"
        );
        assert_eq!(
            reason("https://bücher.de/"),
            "the host `bücher.de` is not ASCII; write it in its punycode form (`xn--…`)"
        );
        assert_eq!(reason("http://[::1/"), "the IPv6 address in `[::1` has no closing `]`");
        assert_eq!(reason("http://[zz::1]/"), "`[zz::1]` is not a valid IPv6 address");
        assert_eq!(reason("http://[::1]x/"), "`x` cannot follow the IPv6 address; write `[address]:port`");
        assert_eq!(reason("https://example.com\\evil.com/"), "a `\\` cannot follow the host; use `/`");
    }

    #[test]
    fn join_resolves_references_as_a_browser_does() {
        let base = Url::parse("http://example.com:8080/a/b/c?x=1").unwrap();
        let join = |reference: &str| base.join(reference).unwrap().to_string();
        assert_eq!(join("d"), "http://example.com:8080/a/b/d");
        assert_eq!(join("./d/"), "http://example.com:8080/a/b/d/");
        assert_eq!(join("../d"), "http://example.com:8080/a/d");
        assert_eq!(join("../../../../d"), "http://example.com:8080/d");
        assert_eq!(join("/d?y=2"), "http://example.com:8080/d?y=2");
        assert_eq!(join("?y=2"), "http://example.com:8080/a/b/c?y=2");
        assert_eq!(join("#frag"), "http://example.com:8080/a/b/c?x=1");
        assert_eq!(join(""), "http://example.com:8080/a/b/c?x=1");
        assert_eq!(join("//other.org/p"), "http://other.org/p");
        assert_eq!(join("HTTPS://Other.org:443"), "https://other.org/");
        assert_eq!(join(" d e "), "http://example.com:8080/a/b/d%20e");
        let error = base.join("ftp://example.com/").unwrap_err();
        assert_eq!(
            error.to_string(),
            "invalid URL `ftp://example.com/`: the scheme `ftp` is not supported; only http and https are"
        );
    }
}
