//! Network grants: where a plugin's requests may go, and the credentials the
//! host adds to them.
//!
//! A plugin reaches nothing by default. Its `[plugins.*]` section names the
//! origins it may reach, and may attach a secret header to one of them:
//!
//! ```toml
//! [plugins.fetch]
//! network = ["https://api.github.com", "https://*.wikipedia.org", "http://127.0.0.1:8080"]
//!
//! [plugins.fetch.secrets]
//! "https://api.github.com" = { header = "Authorization", value = "Bearer ${GITHUB_TOKEN}" }
//! ```
//!
//! An entry is `scheme://host[:port]`: `http` or `https`; a host name, `*.`
//! and a name (one or more labels in front of it), an address (`127.0.0.1`,
//! `[::1]`) or a network (`10.0.0.0/8`, `[fd00::]/8`); a port, or the scheme's
//! default. Nothing else: a path, a query, user info or a wildcard elsewhere is
//! an error naming the entry.
//!
//! A request is allowed when an entry matches its scheme, port and host, and
//! then only to the addresses its name resolves to that are public, or that an
//! entry of the same scheme and port names (as an address or a network): a
//! name granted is not a grant of the loopback address it may resolve to.
//! IPv4-mapped IPv6 addresses are judged as the IPv4 address they carry.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, OnceLock};

use http::{HeaderName, HeaderValue};

/// A URL scheme a grant may name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// `http`, port 80 by default.
    Http,
    /// `https`, port 443 by default.
    Https,
}

impl Scheme {
    /// `http` or `https`; anything else is no scheme keel speaks.
    pub fn parse(text: &str) -> Option<Self> {
        match text.to_ascii_lowercase().as_str() {
            "http" => Some(Scheme::Http),
            "https" => Some(Scheme::Https),
            _ => None,
        }
    }

    /// The port a URL without one means.
    pub fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }

    /// `http` or `https`.
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }
}

/// The host part of an entry.
#[derive(Clone, Debug, PartialEq, Eq)]
enum HostRule {
    /// One name, lowercase, without a trailing dot.
    Name(String),
    /// `*.suffix`: any name of one or more labels followed by `.suffix`.
    Wildcard(String),
    /// A network of addresses: one address is a network of its full length.
    Net { base: IpAddr, prefix: u8 },
}

/// One entry of a plugin's `network` grant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    text: String,
    scheme: Scheme,
    host: HostRule,
    port: u16,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Rule {
    /// Parse an entry; the error says what is wrong with it.
    pub fn parse(entry: &str) -> Result<Self, String> {
        let bad = |why: &str| Err(format!("network entry {entry:?} {why}; an entry is scheme://host[:port]"));
        let Some((scheme, rest)) = entry.split_once("://") else { return bad("has no scheme") };
        let Some(scheme) = Scheme::parse(scheme) else {
            return bad("names a scheme other than http or https");
        };
        if rest.contains(['/', '?', '#']) && !is_cidr(rest) {
            return bad("has a path");
        }
        if rest.contains('@') {
            return bad("has user info");
        }
        let (host, port) = match split_host_port(rest) {
            Ok(split) => split,
            Err(why) => return bad(why),
        };
        let port = port.unwrap_or(scheme.default_port());
        let host = match parse_host_rule(host) {
            Some(host) => host,
            None => return bad("has a host that is not a name, `*.` and a name, an address or a network"),
        };
        Ok(Rule { text: entry.to_owned(), scheme, host, port })
    }

    /// Whether the rule names `(scheme, host, port)`: its host by name, or
    /// an address host by address or network.
    fn matches(&self, scheme: Scheme, host: &Host, port: u16) -> bool {
        if self.scheme != scheme || self.port != port {
            return false;
        }
        match (&self.host, host) {
            (HostRule::Name(name), Host::Name(host)) => name == host,
            (HostRule::Wildcard(suffix), Host::Name(host)) => {
                host.len() > suffix.len() + 1
                    && host.ends_with(suffix.as_str())
                    && host.as_bytes()[host.len() - suffix.len() - 1] == b'.'
            }
            (HostRule::Net { .. }, Host::Addr(addr)) => self.names_address(*addr),
            _ => false,
        }
    }

    /// Whether the rule names `addr` itself, as an address or a network.
    fn names_address(&self, addr: IpAddr) -> bool {
        match self.host {
            HostRule::Net { base, prefix } => in_network(canonical(addr), base, prefix),
            _ => false,
        }
    }

    /// Whether every request this rule allows, another rule allows too.
    fn covered_by(&self, other: &Rule) -> bool {
        if self.scheme != other.scheme || self.port != other.port {
            return false;
        }
        match (&self.host, &other.host) {
            (HostRule::Name(name), _) => other.matches(self.scheme, &Host::Name(name.clone()), self.port),
            (HostRule::Wildcard(a), HostRule::Wildcard(b)) => {
                a == b || (a.ends_with(b.as_str()) && a.as_bytes()[a.len() - b.len() - 1] == b'.')
            }
            (HostRule::Net { base, prefix }, HostRule::Net { base: outer, prefix: outer_prefix }) => {
                prefix >= outer_prefix && in_network(*base, *outer, *outer_prefix)
            }
            _ => false,
        }
    }
}

/// Whether `rest` (after the scheme) is a network such as `10.0.0.0/8`,
/// whose slash is no path.
fn is_cidr(rest: &str) -> bool {
    let Ok((host, _)) = split_host_port(rest) else { return false };
    match host.split_once('/') {
        Some((addr, prefix)) => {
            parse_address(addr).is_some() && !prefix.is_empty() && prefix.bytes().all(|b| b.is_ascii_digit())
        }
        None => false,
    }
}

/// `host[:port]` split, or what is wrong with it. An IPv6 host is
/// bracketed, with an optional `/prefix` after the bracket.
fn split_host_port(rest: &str) -> Result<(&str, Option<u16>), &'static str> {
    let (host, port) = if rest.starts_with('[') {
        let close = rest.find(']').ok_or("has an unclosed `[`")?;
        let after = &rest[close + 1..];
        // `[fd00::]/8:443`: the prefix belongs to the host.
        let host_end = close + 1 + after.find(':').unwrap_or(after.len());
        let (host, port) = rest.split_at(host_end);
        (host, port.strip_prefix(':'))
    } else {
        match rest.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (rest, None),
        }
    };
    if host.is_empty() {
        return Err("has no host");
    }
    match port {
        None => Ok((host, None)),
        Some(port) => match parse_port(port) {
            Some(number) => Ok((host, Some(number))),
            None => Err("has a port that is not a number from 1 to 65535"),
        },
    }
}

/// A port as an entry or a URL writes it: a number from 1 to 65535, in
/// decimal digits alone (`u16`'s parse would take a `+` too).
pub(crate) fn parse_port(text: &str) -> Option<u16> {
    let number = text.parse::<u16>().ok().filter(|&number| number > 0)?;
    text.bytes().all(|b| b.is_ascii_digit()).then_some(number)
}

fn parse_host_rule(host: &str) -> Option<HostRule> {
    let (addr, prefix) = match host.split_once('/') {
        Some((addr, prefix)) => (addr, Some(prefix.parse::<u8>().ok()?)),
        None => (host, None),
    };
    if let Some(addr) = parse_address(addr) {
        let addr = canonical(addr);
        let full = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = prefix.unwrap_or(full);
        if prefix > full {
            return None;
        }
        return Some(HostRule::Net { base: mask(addr, prefix), prefix });
    }
    if prefix.is_some() {
        return None;
    }
    let name = host.trim_end_matches('.').to_ascii_lowercase();
    if let Some(suffix) = name.strip_prefix("*.") {
        return is_host_name(suffix).then(|| HostRule::Wildcard(suffix.to_owned()));
    }
    is_host_name(&name).then_some(HostRule::Name(name))
}

/// An address as a URL or an entry writes it: `127.0.0.1` or `[::1]`.
fn parse_address(text: &str) -> Option<IpAddr> {
    if let Some(inner) = text.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
        return inner.parse::<Ipv6Addr>().ok().map(IpAddr::V6);
    }
    text.parse::<Ipv4Addr>().ok().map(IpAddr::V4)
}

/// Letters, digits and hyphens in dot-separated labels of 1 to 63 characters,
/// not all digits (that would be a malformed address, not a name).
fn is_host_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
        && !name.split('.').next_back().is_some_and(|last| last.bytes().all(|b| b.is_ascii_digit()))
}

/// An IPv4-mapped IPv6 address as the IPv4 address it carries; any other
/// address as it is.
pub fn canonical(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

fn mask(addr: IpAddr, prefix: u8) -> IpAddr {
    match addr {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            let mask = if prefix == 0 { 0 } else { u32::MAX << (32 - prefix) };
            IpAddr::V4(Ipv4Addr::from(bits & mask))
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let mask = if prefix == 0 { 0 } else { u128::MAX << (128 - prefix) };
            IpAddr::V6(Ipv6Addr::from(bits & mask))
        }
    }
}

fn in_network(addr: IpAddr, base: IpAddr, prefix: u8) -> bool {
    addr.is_ipv4() == base.is_ipv4() && mask(addr, prefix) == base
}

/// Why an address is not public, or `None` when it is: the addresses a name
/// granted by name may not reach unless an entry names them.
pub fn special_use(addr: IpAddr) -> Option<&'static str> {
    match canonical(addr) {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            if v4.is_unspecified() || a == 0 {
                Some("unspecified")
            } else if v4.is_loopback() {
                Some("loopback")
            } else if v4.is_private() {
                Some("private")
            } else if v4.is_link_local() {
                Some("link-local")
            } else if a == 100 && (64..128).contains(&b) {
                Some("shared (carrier-grade NAT)")
            } else if v4.is_broadcast() || v4.is_multicast() || a >= 240 {
                Some("broadcast, multicast or reserved")
            } else if v4.is_documentation()
                || (a == 192 && b == 0 && v4.octets()[2] == 0)
                || (a == 198 && (b & 0xfe) == 18)
            {
                Some("reserved")
            } else {
                None
            }
        }
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            if v6.is_unspecified() {
                Some("unspecified")
            } else if v6.is_loopback() {
                Some("loopback")
            } else if (first & 0xfe00) == 0xfc00 {
                Some("unique-local")
            } else if (first & 0xffc0) == 0xfe80 {
                Some("link-local")
            } else if v6.is_multicast() {
                Some("multicast")
            } else if v6.to_ipv4().is_some()
                || first == 0x64
                || first == 0x2002
                || (first == 0x2001 && v6.segments()[1] < 0x200)
            {
                // IPv4-compatible, NAT64, 6to4 and Teredo forms can all carry
                // an IPv4 address that would otherwise be judged alone.
                Some("IPv4-embedding")
            } else if first == 0x2001 && v6.segments()[1] == 0xdb8 {
                Some("reserved")
            } else {
                None
            }
        }
    }
}

/// The host of a request URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Host {
    /// A name, lowercase, without a trailing dot.
    Name(String),
    /// An address literal.
    Addr(IpAddr),
}

impl Host {
    /// The host of a URL's authority, as the URL writes it (`[::1]` bracketed).
    pub fn parse(text: &str) -> Option<Self> {
        if let Some(addr) = parse_address(text) {
            return Some(Host::Addr(canonical(addr)));
        }
        let name = text.trim_end_matches('.').to_ascii_lowercase();
        is_host_name(&name).then_some(Host::Name(name))
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(name) => f.write_str(name),
            Host::Addr(IpAddr::V6(v6)) => write!(f, "[{v6}]"),
            Host::Addr(addr) => write!(f, "{addr}"),
        }
    }
}

/// A request's target, parsed and judged by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// Its scheme.
    pub scheme: Scheme,
    /// Its host.
    pub host: Host,
    /// Its port, the scheme's default when the URL gives none.
    pub port: u16,
}

impl Target {
    /// `scheme://host:port`, the origin a secret is attached to.
    pub fn origin(&self) -> String {
        format!("{}://{}:{}", self.scheme.as_str(), self.host, self.port)
    }
}

/// The certificate authorities a request's TLS is verified against: the
/// bundled Mozilla roots, the same on every machine, and any more the host's
/// configuration trusts (`[network] roots`).
#[derive(Clone)]
pub struct TlsRoots(Arc<rustls::ClientConfig>);

impl TlsRoots {
    /// The bundled Mozilla roots alone, made once.
    pub fn bundled() -> Self {
        static BUNDLED: OnceLock<TlsRoots> = OnceLock::new();
        BUNDLED.get_or_init(|| TlsRoots::with(Vec::new())).clone()
    }

    /// The bundled roots and every certificate of the PEM files `pems`
    /// (each with the path it was read from, for the error).
    pub fn with_extra(pems: &[(std::path::PathBuf, Vec<u8>)]) -> Result<Self, String> {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        let mut extra = Vec::new();
        for (path, pem) in pems {
            let before = extra.len();
            for cert in CertificateDer::pem_slice_iter(pem) {
                extra.push(
                    cert.map_err(|error| format!("{}: not a PEM certificate: {error}", path.display()))?,
                );
            }
            if extra.len() == before {
                return Err(format!("{}: holds no PEM certificate", path.display()));
            }
        }
        Ok(TlsRoots::with(extra))
    }

    fn with(extra: Vec<rustls::pki_types::CertificateDer<'static>>) -> Self {
        let mut roots = rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.into() };
        for cert in extra {
            // Checked as PEM above; a certificate rustls cannot use as a
            // root is left out, as the bundled store's loader does.
            let _ = roots.add(cert);
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        // HTTP/2 when the server offers it, else HTTP/1.1.
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        // No session outlives the call that made it: this set-up is every
        // call's, of every plugin, and a session one call resumed would
        // tell a server that the two calls are one client's. Within a call
        // a connection is kept open for its later requests instead.
        config.resumption = rustls::client::Resumption::disabled();
        TlsRoots(Arc::new(config))
    }

    /// The TLS client set-up.
    pub(crate) fn config(&self) -> Arc<rustls::ClientConfig> {
        self.0.clone()
    }
}

impl Default for TlsRoots {
    fn default() -> Self {
        TlsRoots::bundled()
    }
}

impl PartialEq for TlsRoots {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for TlsRoots {}

impl fmt::Debug for TlsRoots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TlsRoots")
    }
}

/// The entries of one plugin's `network` grant, its secrets, and the roots
/// its TLS is verified against.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetworkGrant {
    rules: Vec<Rule>,
    secrets: Vec<Secret>,
    tls: TlsRoots,
    /// What every secret hides, longest first, made once for all the
    /// sandboxes and requests of the plugin.
    hidden: Arc<[Vec<u8>]>,
}

impl NetworkGrant {
    /// Parse `entries` and `secrets` (origin → header and value, `${NAME}`
    /// read through `env`). Each error names the entry or origin.
    pub fn parse(
        entries: &[String],
        secrets: &[(String, SecretConfig)],
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, String> {
        let rules = entries.iter().map(|entry| Rule::parse(entry)).collect::<Result<Vec<_>, _>>()?;
        let mut parsed = Vec::new();
        for (origin, secret) in secrets {
            let rule = Rule::parse(origin).map_err(|error| format!("secret for {origin:?}: {error}"))?;
            if !rules.iter().any(|grant| rule.covered_by(grant)) {
                return Err(format!(
                    "secret for {origin:?}: its origin is not granted by `network`, so no request could carry it"
                ));
            }
            parsed.push(Secret::new(rule, secret, &env)?);
        }
        let mut hidden: Vec<Vec<u8>> =
            parsed.iter().flat_map(|secret| secret.hidden.iter().cloned()).collect();
        hidden.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        hidden.dedup();
        Ok(NetworkGrant { rules, secrets: parsed, tls: TlsRoots::bundled(), hidden: hidden.into() })
    }

    /// Verify TLS against `tls`.
    pub fn trust(&mut self, tls: TlsRoots) {
        self.tls = tls;
    }

    /// The roots TLS is verified against.
    pub fn tls(&self) -> &TlsRoots {
        &self.tls
    }

    /// Whether anything is granted.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The entries, as written.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The rule that allows `target` by its host, or why none does.
    pub fn allows(&self, target: &Target) -> Result<&Rule, String> {
        self.rules.iter().find(|rule| rule.matches(target.scheme, &target.host, target.port)).ok_or_else(
            || {
                if self.rules.is_empty() {
                    "the plugin has no network grant".to_owned()
                } else {
                    format!(
                        "{} is not granted (network = [{}])",
                        target.origin(),
                        self.rules
                            .iter()
                            .map(|rule| format!("{:?}", rule.text))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                }
            },
        )
    }

    /// Whether `target`'s connection may go to `addr`: a public address, or
    /// one an entry of the target's scheme and port names; else why not.
    pub fn allows_address(&self, target: &Target, addr: IpAddr) -> Result<(), String> {
        let Some(kind) = special_use(addr) else { return Ok(()) };
        let named = self
            .rules
            .iter()
            .any(|rule| rule.scheme == target.scheme && rule.port == target.port && rule.names_address(addr));
        if named {
            return Ok(());
        }
        let shown = Host::Addr(canonical(addr));
        Err(match &target.host {
            Host::Addr(_) => format!("{shown} is a {kind} address, which no network entry names"),
            Host::Name(name) => {
                format!("{name} resolves to {shown}, a {kind} address, which no network entry names")
            }
        })
    }

    /// The secrets to add to a request for `target`.
    pub fn secrets_for<'a>(&'a self, target: &'a Target) -> impl Iterator<Item = &'a Secret> + 'a {
        self.secrets
            .iter()
            .filter(move |secret| secret.origin.matches(target.scheme, &target.host, target.port))
    }

    /// The byte strings of all its secrets that must never reach the guest,
    /// longest first.
    pub(crate) fn hidden(&self) -> &Arc<[Vec<u8>]> {
        &self.hidden
    }

    /// Every secret of the grant.
    pub fn secrets(&self) -> &[Secret] {
        &self.secrets
    }
}

/// `{ header = "...", value = "..." }` of `[plugins.X.secrets]`.
#[derive(Clone, Debug, serde::Deserialize, PartialEq, Eq)]
#[serde(
    deny_unknown_fields,
    expecting = "a table of `header` and `value`, such as `{ header = \"Authorization\", value = \"Bearer ${TOKEN}\" }`"
)]
pub struct SecretConfig {
    /// The header to set.
    pub header: String,
    /// Its value; `${NAME}` is replaced by the host's environment variable.
    pub value: String,
}

/// A header the host adds to requests for one origin. Its value is never
/// shown: `Debug` prints the header name only.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    origin: Rule,
    header: HeaderName,
    value: HeaderValue,
    /// What must never reach the guest: the whole value, and each variable's
    /// value in it long enough to be told from ordinary text.
    hidden: Vec<Vec<u8>>,
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Secret")
            .field("origin", &self.origin.text)
            .field("header", &self.header)
            .finish_non_exhaustive()
    }
}

/// Pieces of a secret shorter than this are not scrubbed on their own: they
/// would match ordinary text. The whole value always is.
pub const MIN_SCRUBBED_BYTES: usize = 6;

impl Secret {
    fn new(
        origin: Rule,
        config: &SecretConfig,
        env: &impl Fn(&str) -> Option<String>,
    ) -> Result<Self, String> {
        let at = &origin.text;
        let header = HeaderName::from_bytes(config.header.as_bytes())
            .map_err(|_| format!("secret for {at:?}: {:?} is not a header name", config.header))?;
        if wasmtime_wasi_http::DEFAULT_FORBIDDEN_HEADERS.contains(&header) {
            return Err(format!("secret for {at:?}: the {header} header is the host's to set"));
        }
        let mut value = String::new();
        let mut pieces = Vec::new();
        let mut rest = config.value.as_str();
        while let Some(start) = rest.find("${") {
            value.push_str(&rest[..start]);
            let after = &rest[start + 2..];
            let Some(end) = after.find('}') else {
                return Err(format!("secret for {at:?}: `${{` without a closing `}}` in its value"));
            };
            let name = &after[..end];
            if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                return Err(format!("secret for {at:?}: ${{{name}}} is not an environment variable name"));
            }
            let Some(var) = env(name) else {
                return Err(format!("secret for {at:?}: environment variable {name} is not set"));
            };
            value.push_str(&var);
            pieces.push(var.into_bytes());
            rest = &after[end + 1..];
        }
        value.push_str(rest);
        let header_value = HeaderValue::from_str(&value)
            .map_err(|_| format!("secret for {at:?}: its value is not a valid header value"))?;
        let mut hidden: Vec<Vec<u8>> = vec![value.into_bytes()];
        hidden.extend(pieces.into_iter().filter(|piece| piece.len() >= MIN_SCRUBBED_BYTES));
        hidden.retain(|piece| !piece.is_empty());
        hidden.sort_by_key(|piece| std::cmp::Reverse(piece.len()));
        hidden.dedup();
        let mut header_value = header_value;
        header_value.set_sensitive(true);
        Ok(Secret { origin, header, value: header_value, hidden })
    }

    /// The origin it is added to requests for, as written.
    pub fn origin(&self) -> &Rule {
        &self.origin
    }

    /// The header it sets.
    pub fn header(&self) -> &HeaderName {
        &self.header
    }

    /// Its value, marked sensitive.
    pub(crate) fn value(&self) -> &HeaderValue {
        &self.value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(entries: &[&str]) -> NetworkGrant {
        NetworkGrant::parse(&entries.iter().map(|e| e.to_string()).collect::<Vec<_>>(), &[], |_| None)
            .unwrap()
    }

    fn target(scheme: Scheme, host: &str, port: u16) -> Target {
        Target { scheme, host: Host::parse(host).unwrap(), port }
    }

    #[test]
    fn entries_name_scheme_host_and_port() {
        let grant = grant(&["https://api.github.com", "https://*.wikipedia.org", "http://127.0.0.1:8080"]);
        assert!(grant.allows(&target(Scheme::Https, "api.github.com", 443)).is_ok());
        assert!(
            grant.allows(&target(Scheme::Https, "API.GitHub.com.", 443)).is_ok(),
            "case and a trailing dot"
        );
        assert!(grant.allows(&target(Scheme::Http, "api.github.com", 443)).is_err(), "the scheme");
        assert!(grant.allows(&target(Scheme::Https, "api.github.com", 8443)).is_err(), "the port");
        assert!(grant.allows(&target(Scheme::Https, "github.com", 443)).is_err());
        assert!(grant.allows(&target(Scheme::Https, "en.wikipedia.org", 443)).is_ok());
        assert!(grant.allows(&target(Scheme::Https, "a.b.wikipedia.org", 443)).is_ok(), "one or more labels");
        assert!(grant.allows(&target(Scheme::Https, "wikipedia.org", 443)).is_err(), "at least one label");
        assert!(grant.allows(&target(Scheme::Https, "evilwikipedia.org", 443)).is_err(), "a label boundary");
        assert!(grant.allows(&target(Scheme::Http, "127.0.0.1", 8080)).is_ok());
        assert!(
            grant.allows(&target(Scheme::Http, "[::ffff:127.0.0.1]", 8080)).is_ok(),
            "mapped IPv6 is IPv4"
        );
        assert!(grant.allows(&target(Scheme::Http, "127.0.0.1", 80)).is_err());
        assert!(
            grant.allows(&target(Scheme::Http, "localhost", 8080)).is_err(),
            "an address is not its name"
        );
    }

    #[test]
    fn a_bad_entry_is_an_error_naming_it() {
        let error = |entry: &str| Rule::parse(entry).unwrap_err();
        assert_eq!(
            error("https://api.github.com/repos"),
            "network entry \"https://api.github.com/repos\" has a path; an entry is scheme://host[:port]"
        );
        assert!(error("api.github.com").contains("has no scheme"));
        assert!(error("ftp://x.org").contains("other than http or https"));
        assert!(error("https://x.org:0").contains("port"));
        assert!(error("https://x.org:99999").contains("port"));
        assert!(error("https://user@x.org").contains("user info"));
        assert!(error("https://a.*.org").contains("host"));
        assert!(error("https://*").contains("host"));
        assert!(error("http://10.0.0.0/33").contains("host"));
        assert!(error("http://x.org/8").contains("path"));
        assert!(error("https://").contains("no host"));
        assert!(error("https://x.org?q").contains("path"));
    }

    #[test]
    fn networks_match_addresses_within_them() {
        let grant = grant(&["http://10.0.0.0/8", "http://[fd00::]/8:8080"]);
        assert!(grant.allows(&target(Scheme::Http, "10.1.2.3", 80)).is_ok());
        assert!(grant.allows(&target(Scheme::Http, "11.1.2.3", 80)).is_err());
        assert!(grant.allows(&target(Scheme::Http, "[fd12::1]", 8080)).is_ok());
        assert!(grant.allows(&target(Scheme::Http, "[fd12::1]", 80)).is_err());
        let t = target(Scheme::Http, "intranet", 80);
        assert!(grant.allows_address(&t, "10.9.9.9".parse().unwrap()).is_ok(), "a named network");
        assert!(grant.allows_address(&t, "192.168.1.1".parse().unwrap()).is_err());
    }

    #[test]
    fn special_addresses_need_an_entry_that_names_them() {
        let grant = grant(&["http://localhost:8080", "https://example.org"]);
        let local = target(Scheme::Http, "localhost", 8080);
        assert_eq!(
            grant.allows_address(&local, "127.0.0.1".parse().unwrap()).unwrap_err(),
            "localhost resolves to 127.0.0.1, a loopback address, which no network entry names"
        );
        let public = target(Scheme::Https, "example.org", 443);
        for addr in [
            "169.254.169.254",
            "10.0.0.1",
            "172.16.0.1",
            "192.168.0.1",
            "100.64.0.1",
            "0.0.0.0",
            "::",
            "::1",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::7f00:1",
            "2002:7f00:1::",
            "224.0.0.1",
        ] {
            assert!(grant.allows_address(&public, addr.parse().unwrap()).is_err(), "{addr}");
        }
        assert!(grant.allows_address(&public, "93.184.215.14".parse().unwrap()).is_ok());
        assert!(
            grant.allows_address(&public, "2606:2800:21f:cb07:6820:80da:af6b:8b2c".parse().unwrap()).is_ok()
        );
        let named = self::grant(&["http://127.0.0.1:8080", "http://localhost:8080"]);
        assert!(named.allows_address(&local, "127.0.0.1".parse().unwrap()).is_ok());
        assert!(named.allows_address(&local, "::ffff:127.0.0.1".parse().unwrap()).is_ok(), "judged as IPv4");
        assert!(
            named
                .allows_address(&target(Scheme::Http, "localhost", 9090), "127.0.0.1".parse().unwrap())
                .is_err(),
            "an entry names an address for its own scheme and port only"
        );
    }

    #[test]
    fn a_secret_must_be_for_a_granted_origin_and_its_variables_set() {
        let secret = |origin: &str, value: &str| {
            NetworkGrant::parse(
                &["https://api.github.com".into(), "https://*.example.org".into()],
                &[(origin.into(), SecretConfig { header: "Authorization".into(), value: value.into() })],
                |name| (name == "TOKEN").then(|| "s3cr3t-t0ken".to_string()),
            )
        };
        let grant = secret("https://api.github.com", "Bearer ${TOKEN}").unwrap();
        let api = target(Scheme::Https, "api.github.com", 443);
        let found: Vec<_> = grant.secrets_for(&api).collect();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].value().to_str().unwrap(), "Bearer s3cr3t-t0ken");
        assert_eq!(**grant.hidden(), [b"Bearer s3cr3t-t0ken".to_vec(), b"s3cr3t-t0ken".to_vec()]);
        assert!(!format!("{grant:?}").contains("s3cr3t"), "Debug never shows a value");
        assert!(grant.secrets_for(&target(Scheme::Https, "github.com", 443)).next().is_none());
        assert!(secret("https://a.example.org", "x").is_ok(), "covered by a wildcard");
        assert!(secret("https://*.b.example.org", "x").is_ok(), "a narrower wildcard");
        assert!(secret("https://evil.org", "x").unwrap_err().contains("not granted"));
        assert!(secret("http://api.github.com", "x").unwrap_err().contains("not granted"), "another scheme");
        assert_eq!(
            secret("https://api.github.com", "Bearer ${MISSING}").unwrap_err(),
            "secret for \"https://api.github.com\": environment variable MISSING is not set"
        );
        assert!(secret("https://api.github.com", "${TOKEN").unwrap_err().contains("closing"));
        assert!(secret("https://api.github.com", "a\nb").unwrap_err().contains("not a valid header value"));
    }
}
