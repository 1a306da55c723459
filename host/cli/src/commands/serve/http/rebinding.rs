//! The check against DNS rebinding every request to `--http` passes before
//! it is answered, `/mcp` and `/metrics` alike: its `Host` (or, over HTTP/2,
//! which sends none, its `:authority`) must name an allowed host, and its
//! `Origin`, when it has one, an allowed page. rmcp checks the same names
//! for `/mcp` in the same way, and logs each refusal as a warning; this check
//! comes first, so a refusal, which anyone who can reach the server can
//! cause, is logged from `KEEL_LOG=debug` only, like anything else a client
//! did.

use hyper::{Request, header};

/// The hosts and page origins a server answers to.
pub struct Rebinding {
    /// Each allowed host, with the one port it is allowed on (any without).
    hosts: Vec<(String, Option<u16>)>,
    /// The pages allowed to call; `None` when any `Origin` passes.
    origins: Option<Vec<AllowedOrigin>>,
}

/// Why a request was refused.
#[derive(Debug, PartialEq)]
pub enum Refusal {
    /// Its `Host` (or `:authority`) is missing or names no allowed host.
    Host,
    /// Its `Origin` names no allowed page.
    Origin,
}

impl Refusal {
    /// What the client is told, as the body of a `403`.
    pub fn text(&self) -> &'static str {
        match self {
            Refusal::Host => "forbidden: the Host header names no allowed host\n",
            Refusal::Origin => "forbidden: the Origin header names no allowed origin\n",
        }
    }
}

impl Rebinding {
    /// Requests to any of `hosts` (`name` on any port, `name:port` on that
    /// port only), from a page of one of `origins` (`scheme://host:port`,
    /// `:*` for any port, or `null`) or from no page; from any page when
    /// `origins` is `None`.
    pub fn new(hosts: &[String], origins: Option<&[String]>) -> Self {
        let hosts = hosts
            .iter()
            .filter_map(|allowed| {
                authority(allowed).or_else(|| Some((allowed.trim().to_ascii_lowercase(), None)))
            })
            .collect();
        let origins =
            origins.map(|origins| origins.iter().filter_map(|origin| AllowedOrigin::parse(origin)).collect());
        Rebinding { hosts, origins }
    }

    /// Whether `request` may be answered, or why not.
    pub fn check<B>(&self, request: &Request<B>) -> Result<(), Refusal> {
        let headers = request.headers();
        let host = match headers.get(header::HOST) {
            Some(value) => value.to_str().ok().and_then(authority),
            None => request.uri().authority().and_then(|given| authority(given.as_str())),
        };
        let Some((host, port)) = host else { return Err(Refusal::Host) };
        let allowed = self.hosts.iter().any(|(name, allowed_port)| {
            *name == host && allowed_port.is_none_or(|allowed_port| port == Some(allowed_port))
        });
        if !allowed {
            return Err(Refusal::Host);
        }
        let (Some(origins), Some(origin)) = (&self.origins, headers.get(header::ORIGIN)) else {
            return Ok(());
        };
        let origin = origin.to_str().ok().and_then(Origin::parse);
        match origin {
            Some(origin) if origins.iter().any(|allowed| allowed.admits(&origin)) => Ok(()),
            _ => Err(Refusal::Origin),
        }
    }
}

/// The host (lowercase, an IPv6 address without its brackets) and port
/// `text` names, if it is an authority.
fn authority(text: &str) -> Option<(String, Option<u16>)> {
    let authority: hyper::http::uri::Authority = text.trim().parse().ok()?;
    let host = authority.host().trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase();
    Some((host, authority.port_u16()))
}

/// A page's origin, as a browser's `Origin` header names it.
#[derive(Debug, PartialEq)]
enum Origin {
    /// `null`: a page of no origin one can name (a file, a sandboxed frame).
    Null,
    /// `scheme://host[:port]`.
    Page { scheme: String, host: String, port: Option<u16> },
}

impl Origin {
    fn parse(text: &str) -> Option<Origin> {
        let text = text.trim();
        if text.eq_ignore_ascii_case("null") {
            return Some(Origin::Null);
        }
        let uri = hyper::http::Uri::try_from(text).ok()?;
        let (host, port) = authority(uri.authority()?.as_str())?;
        Some(Origin::Page { scheme: uri.scheme_str()?.to_ascii_lowercase(), host, port })
    }
}

/// An allowed origin: an origin whose port may be any (`:*`, or none given).
#[derive(Debug)]
struct AllowedOrigin {
    origin: Origin,
    any_port: bool,
}

impl AllowedOrigin {
    fn parse(text: &str) -> Option<AllowedOrigin> {
        let text = text.trim();
        if let Some(page) = text.strip_suffix(":*") {
            let origin @ Origin::Page { port: None, .. } = Origin::parse(page)? else { return None };
            return Some(AllowedOrigin { origin, any_port: true });
        }
        let origin = Origin::parse(text)?;
        let any_port = matches!(origin, Origin::Page { port: None, .. });
        Some(AllowedOrigin { origin, any_port })
    }

    /// Whether a page of `origin` may call; a port left out is the
    /// scheme's own (RFC 6454 §6.2).
    fn admits(&self, origin: &Origin) -> bool {
        let default_port = |scheme: &str| match scheme {
            "http" => Some(80),
            "https" => Some(443),
            _ => None,
        };
        match (&self.origin, origin) {
            (Origin::Null, Origin::Null) => true,
            (
                Origin::Page { scheme, host, port },
                Origin::Page { scheme: its_scheme, host: its_host, port: its_port },
            ) => {
                scheme == its_scheme
                    && host == its_host
                    && (self.any_port || its_port.or_else(|| default_port(its_scheme)) == *port)
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(authority: Option<&str>, host: Option<&str>, origin: Option<&str>) -> Request<()> {
        let uri = match authority {
            Some(authority) => format!("http://{authority}/mcp"),
            None => "/mcp".to_owned(),
        };
        let mut request = Request::post(uri);
        if let Some(host) = host {
            request = request.header(header::HOST, host);
        }
        if let Some(origin) = origin {
            request = request.header(header::ORIGIN, origin);
        }
        request.body(()).unwrap()
    }

    #[test]
    fn only_a_host_of_the_list_is_allowed() {
        let hosts = super::super::allowed_hosts(&["tools.example.com".into(), "keel:80".into()]);
        let rebinding = Rebinding::new(&hosts, None);
        let allowed = |host: &str| rebinding.check(&request(None, Some(host), None)).is_ok();
        assert!(allowed("127.0.0.1:7331"));
        assert!(allowed("localhost"));
        assert!(allowed("[::1]:9464"));
        assert!(allowed("Tools.Example.com:443"), "a name alone allows any port");
        assert!(allowed("keel:80"));
        assert!(!allowed("keel:8080"), "a name with a port allows that port only");
        assert!(!allowed("attacker.example:7331"));
        assert_eq!(rebinding.check(&request(None, None, None)), Err(Refusal::Host), "no Host, no answer");
    }

    #[test]
    fn an_http2_request_is_checked_by_its_authority() {
        let rebinding = Rebinding::new(&super::super::allowed_hosts(&[]), None);
        assert_eq!(rebinding.check(&request(Some("127.0.0.1:7331"), None, None)), Ok(()));
        assert_eq!(rebinding.check(&request(Some("evil.example:7331"), None, None)), Err(Refusal::Host));
        // A Host, when there is one, is what is checked.
        assert_eq!(
            rebinding.check(&request(Some("127.0.0.1:7331"), Some("evil.example"), None)),
            Err(Refusal::Host)
        );
    }

    #[test]
    fn only_a_page_of_the_list_may_call() {
        let origins: Vec<String> =
            ["http://localhost:*", "https://app.example.com:443", "http://any.example", "null"]
                .map(String::from)
                .to_vec();
        let rebinding = Rebinding::new(&super::super::allowed_hosts(&[]), Some(&origins));
        let check = |origin: Option<&str>| rebinding.check(&request(None, Some("localhost"), origin));
        for origin in [
            None,
            Some("http://localhost:5173"),
            Some("http://LOCALHOST"),
            Some("https://app.example.com"),
            Some("https://app.example.com:443"),
            Some("http://any.example:8080"),
            Some("null"),
        ] {
            assert_eq!(check(origin), Ok(()), "{origin:?}");
        }
        for origin in [
            "https://localhost:5173",
            "https://app.example.com:8443",
            "http://app.example.com",
            "http://evil.example",
            "evil.example",
            "",
        ] {
            assert_eq!(check(Some(origin)), Err(Refusal::Origin), "{origin:?}");
        }
        let anyone = Rebinding::new(&super::super::allowed_hosts(&[]), None);
        assert_eq!(anyone.check(&request(None, Some("localhost"), Some("http://evil.example"))), Ok(()));
    }
}
