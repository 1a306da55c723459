//! Plugins from OCI registries: `oci://REGISTRY/REPOSITORY:TAG` or
//! `…@sha256:DIGEST`.
//!
//! A plugin is published as a WebAssembly OCI artifact in the layout `wkg`
//! and wassette use: an image manifest whose config has the media type
//! [`WASM_CONFIG_MEDIA_TYPE`] and whose one layer, of type
//! [`WASM_LAYER_MEDIA_TYPE`], is the component. `oci-client` speaks the
//! distribution protocol; keel checks what it gets:
//!
//! - every blob (the manifest, the component) against its digest before it
//!   is kept, then keeps it by digest under `oci/blobs/sha256/` in the
//!   compile cache's directory, written whole or not at all;
//! - a tag is resolved to a manifest digest once and the answer kept under
//!   `oci/tags/`, so a second start makes no network request at all; a
//!   lock pins the digest itself ([`Resolve::Pinned`]), and `keel lock`
//!   resolves tags afresh ([`Resolve::Fresh`]).
//!
//! Registries on the loopback address are spoken to over plain HTTP, any
//! other over HTTPS unless `[registries] insecure` names it. Credentials
//! come from `KEEL_REGISTRY_USERNAME` and `KEEL_REGISTRY_PASSWORD`, else
//! from the Docker configuration file (`$DOCKER_CONFIG/config.json`, else
//! `~/.docker/config.json`, its `auths` entry for the registry); they are
//! never logged, and no error carries them.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};
use oci_client::manifest::{
    OCI_IMAGE_INDEX_MEDIA_TYPE, OCI_IMAGE_MEDIA_TYPE, OciDescriptor, OciImageManifest,
};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};

use crate::error::{Error, Result};
use crate::load::lock::{is_sha256_hex, sha256_hex};

/// The config media type of a WebAssembly component artifact.
pub const WASM_CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";
/// The layer media type of the component itself.
pub const WASM_LAYER_MEDIA_TYPE: &str = "application/wasm";
/// The scheme of a plugin reference.
pub const SCHEME: &str = "oci://";

/// The registry's part of a `--plugins` argument: whether it names an OCI
/// artifact rather than a file.
pub fn is_reference(text: &str) -> bool {
    text.starts_with(SCHEME)
}

/// How a tag is turned into a manifest digest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolve<'a> {
    /// As it was resolved the first time, asking the registry only when it
    /// never was.
    Cached,
    /// Asking the registry now (`keel lock`).
    Fresh,
    /// Not at all: this manifest digest (`sha256:…`), which a lock recorded.
    Pinned(&'a str),
}

/// A component pulled from a registry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pulled {
    /// The file holding the component, in the blob store.
    pub file: PathBuf,
    /// The manifest's digest, `sha256:…`.
    pub manifest: String,
    /// The component's sha256 digest, in hex.
    pub sha256: String,
}

/// Pulls and pushes plugins; keeps what it pulled in `dir/oci`.
pub struct Registries {
    dir: PathBuf,
    insecure: Vec<String>,
}

/// Credentials for one registry. `Debug` shows the user name only.
struct Credentials {
    username: String,
    password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials({}, ***)", self.username)
    }
}

impl Registries {
    /// Keep pulled blobs under `cache_dir/oci`; speak plain HTTP to the
    /// registries of `insecure` (`host:port`) and to loopback ones.
    pub fn new(cache_dir: &Path, insecure: &[String]) -> Self {
        Registries { dir: cache_dir.join("oci"), insecure: insecure.to_vec() }
    }

    /// Pull the component `reference` names (`oci://…`), or find it where
    /// it was kept; its tag resolved as `resolve` says.
    pub async fn pull(&self, reference: &str, resolve: Resolve<'_>) -> Result<Pulled> {
        let fail =
            |reason: String| Error::Registry { action: "pull", reference: reference.to_owned(), reason };
        let parsed = parse(reference).map_err(fail)?;
        let digest = match (parsed.digest(), resolve) {
            (_, Resolve::Pinned(digest)) => digest.to_owned(),
            (Some(digest), _) => digest.to_owned(),
            (None, Resolve::Cached) => match self.cached_tag(&parsed) {
                Some(digest) => digest,
                None => self.resolve_tag(&parsed).await.map_err(fail)?,
            },
            (None, Resolve::Fresh) => self.resolve_tag(&parsed).await.map_err(fail)?,
        };
        self.pull_digest(&parsed, &digest).await.map_err(fail)
    }

    /// Push the component `bytes` to `reference` (`oci://…:TAG`) as a
    /// WebAssembly artifact; the manifest's digest.
    pub async fn push(&self, reference: &str, bytes: Vec<u8>) -> Result<String> {
        let fail =
            |reason: String| Error::Registry { action: "push", reference: reference.to_owned(), reason };
        let parsed = parse(reference).map_err(fail)?;
        if parsed.digest().is_some() {
            let tagged = reference.split_once('@').map_or(reference, |(name, _)| name);
            return Err(fail(format!(
                "a push names a tag, such as {tagged}:1.0, not a digest: the digest is that of the bytes \
                 pushed, and is printed once they are"
            )));
        }
        let layer_digest = format!("sha256:{}", sha256_hex(&bytes));
        let config = serde_json::json!({
            "architecture": "wasm",
            "os": "wasip2",
            "layerDigests": [layer_digest],
        });
        let config = Config::new(config.to_string().into_bytes(), WASM_CONFIG_MEDIA_TYPE.to_owned(), None);
        let layers = [ImageLayer::new(bytes, WASM_LAYER_MEDIA_TYPE.to_owned(), None)];
        let manifest = OciImageManifest::build(&layers, &config, None);
        let text = serde_json::to_vec(&manifest).map_err(|error| fail(error.to_string()))?;
        let digest = format!("sha256:{}", sha256_hex(&text));
        let client = self.client(&parsed);
        client.store_auth_if_needed(parsed.resolve_registry(), &self.auth(&parsed)).await;
        let [layer] = layers;
        let pushed = async {
            client.push_blob(&parsed, layer.data, &manifest.layers[0].digest).await?;
            client.push_blob(&parsed, config.data, &manifest.config.digest).await?;
            // The manifest is sent as the very bytes its digest was taken of.
            let content_type = http::HeaderValue::from_static(OCI_IMAGE_MEDIA_TYPE);
            client.push_manifest_raw(&parsed, text, content_type).await
        };
        pushed.await.map_err(|error| fail(describe(&error)))?;
        Ok(digest)
    }

    async fn resolve_tag(&self, reference: &Reference) -> Result<String, String> {
        let client = self.client(reference);
        let (raw, _) = client
            .pull_manifest_raw(reference, &self.auth(reference), MANIFEST_TYPES)
            .await
            .map_err(|error| describe_manifest_pull(&error, reference))?;
        let digest = format!("sha256:{}", sha256_hex(&raw));
        // What cannot be a component is refused before anything is kept:
        // the next pull of the tag asks the registry again.
        wasm_layer(&raw)?;
        self.keep(&self.blob_path(&digest, ""), &raw)?;
        self.keep(&self.tag_path(reference), digest.as_bytes())?;
        Ok(digest)
    }

    async fn pull_digest(&self, reference: &Reference, digest: &str) -> Result<Pulled, String> {
        let hex = digest_hex(digest)?;
        let manifest_file = self.blob_path(digest, "");
        let layer = match std::fs::read(&manifest_file) {
            Ok(raw) if sha256_hex(&raw) == hex => wasm_layer(&raw)?,
            _ => {
                let by_digest = reference.clone_with_digest(digest.to_owned());
                let client = self.client(reference);
                let (raw, _) = client
                    .pull_manifest_raw(&by_digest, &self.auth(reference), MANIFEST_TYPES)
                    .await
                    .map_err(|error| describe_manifest_pull(&error, &by_digest))?;
                let actual = sha256_hex(&raw);
                if actual != hex {
                    return Err(format!("the manifest has digest sha256:{actual}, not {digest}"));
                }
                // Kept only once it is known to be a component's.
                let layer = wasm_layer(&raw)?;
                self.keep(&manifest_file, &raw)?;
                layer
            }
        };
        let layer_hex = digest_hex(&layer.digest)?.to_owned();
        let file = self.blob_path(&layer.digest, ".wasm");
        if !file.is_file() {
            let client = self.client(reference);
            client.store_auth_if_needed(reference.resolve_registry(), &self.auth(reference)).await;
            let mut bytes = Vec::new();
            client.pull_blob(reference, &layer, &mut bytes).await.map_err(|error| describe(&error))?;
            let actual = sha256_hex(&bytes);
            if actual != layer_hex {
                return Err(format!("the component blob has digest sha256:{actual}, not {}", layer.digest));
            }
            // Said of the reference, not later of a file in the cache.
            if !bytes.starts_with(b"\0asm") {
                return Err(format!(
                    "its {WASM_LAYER_MEDIA_TYPE} layer is not a WebAssembly file (no `\\0asm` header)"
                ));
            }
            self.keep(&file, &bytes)?;
        }
        Ok(Pulled { file, manifest: digest.to_owned(), sha256: layer_hex })
    }

    fn cached_tag(&self, reference: &Reference) -> Option<String> {
        let held = std::fs::read_to_string(self.tag_path(reference)).ok()?;
        digest_hex(&held).is_ok().then_some(held)
    }

    fn tag_path(&self, reference: &Reference) -> PathBuf {
        let name = format!(
            "{}/{}:{}",
            reference.resolve_registry(),
            reference.repository(),
            reference.tag().unwrap_or("latest")
        );
        self.dir.join("tags").join(blake3::hash(name.as_bytes()).to_hex().as_str())
    }

    fn blob_path(&self, digest: &str, suffix: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
        self.dir.join("blobs/sha256").join(format!("{hex}{suffix}"))
    }

    fn keep(&self, path: &Path, bytes: &[u8]) -> Result<(), String> {
        crate::fs::write_atomically(path, bytes)
            .map_err(|error| format!("failed to write {}: {error}", path.display()))
    }

    fn client(&self, reference: &Reference) -> Client {
        // reqwest's rustls needs a process-wide provider: the one the
        // egress path uses. Another installed first is as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let registry = reference.resolve_registry().to_owned();
        let plain = is_loopback(&registry) || self.insecure.contains(&registry);
        let protocol =
            if plain { ClientProtocol::HttpsExcept(vec![registry]) } else { ClientProtocol::Https };
        Client::new(ClientConfig { protocol, ..ClientConfig::default() })
    }

    fn auth(&self, reference: &Reference) -> RegistryAuth {
        match credentials(reference.resolve_registry()) {
            Some(Credentials { username, password }) => RegistryAuth::Basic(username, password),
            None => RegistryAuth::Anonymous,
        }
    }
}

/// The one WebAssembly layer of the manifest `raw`, or why it is not a
/// component artifact.
fn wasm_layer(raw: &[u8]) -> Result<OciDescriptor, String> {
    if serde_json::from_slice::<MediaType>(raw)
        .is_ok_and(|held| held.media_type == OCI_IMAGE_INDEX_MEDIA_TYPE)
    {
        return Err(
            "it is an image index (a manifest for each platform), not a WebAssembly component artifact"
                .to_owned(),
        );
    }
    let manifest: OciImageManifest = serde_json::from_slice(raw)
        .map_err(|error| format!("the manifest is not an OCI image manifest: {error}"))?;
    if manifest.config.media_type != WASM_CONFIG_MEDIA_TYPE {
        return Err(format!(
            "its config has media type {}, not {WASM_CONFIG_MEDIA_TYPE}: not a WebAssembly component artifact",
            manifest.config.media_type
        ));
    }
    let mut layers = manifest.layers.into_iter().filter(|layer| layer.media_type == WASM_LAYER_MEDIA_TYPE);
    match (layers.next(), layers.count()) {
        (Some(layer), 0) => Ok(layer),
        (first, rest) => Err(format!(
            "it has {} layers of type {WASM_LAYER_MEDIA_TYPE}, not one",
            usize::from(first.is_some()) + rest
        )),
    }
}

/// The reference of `oci://…`, which must name its registry and a tag or
/// a digest: left out, a registry would be Docker Hub's and a tag `latest`,
/// as a container tool takes them, and `oci://registry/grep:1` would pull a
/// stranger's image from Docker Hub rather than fail.
fn parse(reference: &str) -> Result<Reference, String> {
    let rest =
        reference.strip_prefix(SCHEME).ok_or_else(|| format!("a plugin reference starts with {SCHEME}"))?;
    let parsed: Reference = rest.parse().map_err(|error| format!("not an OCI reference: {error}"))?;
    // A registry is a first component with a dot or a port, or `localhost`,
    // as OCI references tell it from a repository's first name.
    let registry = rest.split_once('/').map(|(first, _)| first);
    if !registry.is_some_and(|first| first.contains(['.', ':']) || first == "localhost") {
        return Err(format!(
            "no registry named; write its host first, such as {SCHEME}ghcr.io/{rest} or {SCHEME}localhost:5000/{rest}"
        ));
    }
    let name = rest.rsplit_once('/').map_or(rest, |(_, name)| name);
    if !name.contains([':', '@']) {
        return Err(format!(
            "no tag nor digest named; add one, such as {SCHEME}{rest}:1.0 or {SCHEME}{rest}@sha256:…"
        ));
    }
    if let Some(digest) = parsed.digest() {
        digest_hex(digest)?;
    }
    Ok(parsed)
}

/// The hex of a `sha256:…` digest.
fn digest_hex(digest: &str) -> Result<&str, String> {
    digest
        .strip_prefix("sha256:")
        .filter(|hex| is_sha256_hex(hex))
        .ok_or_else(|| format!("{digest:?} is not a sha256 digest (sha256: and 64 lowercase hex digits)"))
}

/// Whether `registry` (`host[:port]`) is on the loopback address.
fn is_loopback(registry: &str) -> bool {
    let host = match registry.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) && !host.ends_with(':') => host,
        _ => registry,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The manifest types a pull accepts: an image manifest, which a component
/// artifact is, and an index, only to say that it is one.
const MANIFEST_TYPES: &[&str] = &[OCI_IMAGE_MEDIA_TYPE, OCI_IMAGE_INDEX_MEDIA_TYPE];

/// The `mediaType` a manifest declares.
#[derive(serde::Deserialize)]
struct MediaType {
    #[serde(rename = "mediaType", default)]
    media_type: String,
}

/// [`describe`] of a failed pull of the manifest `reference` names: a
/// registry that has no such manifest says so in words.
fn describe_manifest_pull(error: &oci_client::errors::OciDistributionError, reference: &Reference) -> String {
    use oci_client::errors::{OciDistributionError as E, OciErrorCode as Code};
    let unknown = |code: &Code| matches!(code, Code::ManifestUnknown | Code::NameUnknown | Code::NotFound);
    let missing = match error {
        E::RegistryError { envelope, .. } => envelope.errors.iter().any(|error| unknown(&error.code)),
        E::ImageManifestNotFoundError(_) => true,
        _ => false,
    };
    if !missing {
        return describe(error);
    }
    let version = match (reference.digest(), reference.tag()) {
        (Some(digest), _) => format!("@{digest}"),
        (None, tag) => format!(":{}", tag.unwrap_or("latest")),
    };
    format!("the registry {} has no {}{version}", reference.resolve_registry(), reference.repository())
}

/// The error of the client, in one line; a refusal for want of credentials
/// says where keel takes them from. It never holds credentials: the client
/// sends them in headers, which its errors do not quote.
fn describe(error: &oci_client::errors::OciDistributionError) -> String {
    use oci_client::errors::OciDistributionError as E;
    if let E::RequestError(request) = error
        && request.is_connect()
    {
        // The innermost cause says why (`Connection refused`); the layers
        // above it only repeat that a request failed.
        let mut cause: &dyn std::error::Error = request;
        while let Some(inner) = cause.source() {
            cause = inner;
        }
        let at = request.url().map_or_else(String::new, |url| {
            let host = url.host_str().unwrap_or_default();
            url.port_or_known_default().map_or_else(|| format!(" {host}"), |port| format!(" {host}:{port}"))
        });
        return format!("could not connect to the registry{at}: {cause}");
    }
    let mut text = match error {
        E::ServerError { code, url, message } => server_error(*code, url, message),
        _ => error.to_string(),
    };
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text = format!("{text}: {cause}");
        source = cause.source();
    }
    if matches!(
        error,
        E::UnauthorizedError { .. } | E::AuthenticationFailure(_) | E::ServerError { code: 401 | 403, .. }
    ) {
        text.push_str(CREDENTIALS_HINT);
    }
    text
}

/// An HTTP error the server answered with, in one line: a body that is a
/// page (a web server, not a registry) is named as one, not quoted, and a
/// long one is cut.
fn server_error(code: u16, url: &str, body: &str) -> String {
    const SHOWN: usize = 200;
    let reason = http::StatusCode::from_u16(code).ok().and_then(|status| status.canonical_reason());
    let status = reason.map_or_else(|| code.to_string(), |reason| format!("{code} {reason}"));
    let body = body.trim();
    let said = if body.starts_with('<') {
        " with an HTML page: not an OCI registry's answer".to_owned()
    } else if body.is_empty() {
        String::new()
    } else {
        let line: String = body.split_whitespace().collect::<Vec<_>>().join(" ");
        match line.char_indices().nth(SHOWN) {
            Some((cut, _)) => format!(": {}…", &line[..cut]),
            None => format!(": {line}"),
        }
    };
    format!("{url} answered {status}{said}")
}

/// Where a refused request's credentials come from (README, "Plugins from
/// registries").
const CREDENTIALS_HINT: &str = " (credentials: KEEL_REGISTRY_USERNAME and KEEL_REGISTRY_PASSWORD, \
                                else the registry's entry in the Docker configuration file)";

/// The credentials for `registry`: the environment's, else the Docker
/// configuration file's.
fn credentials(registry: &str) -> Option<Credentials> {
    if let (Ok(username), Ok(password)) =
        (std::env::var("KEEL_REGISTRY_USERNAME"), std::env::var("KEEL_REGISTRY_PASSWORD"))
    {
        return Some(Credentials { username, password });
    }
    let file = match std::env::var_os("DOCKER_CONFIG") {
        Some(dir) => PathBuf::from(dir).join("config.json"),
        None => PathBuf::from(std::env::var_os("HOME")?).join(".docker/config.json"),
    };
    let config: serde_json::Value = serde_json::from_slice(&std::fs::read(file).ok()?).ok()?;
    let auths = config.get("auths")?.as_object()?;
    let entry = auths.iter().find(|(key, _)| {
        let key = key.trim_start_matches("https://").trim_start_matches("http://");
        key.split('/').next() == Some(registry)
    })?;
    let entry = entry.1;
    if let Some(auth) = entry.get("auth").and_then(|auth| auth.as_str()) {
        let decoded = base64::engine::general_purpose::STANDARD.decode(auth).ok()?;
        let (username, password) =
            String::from_utf8(decoded).ok()?.split_once(':').map(|(u, p)| (u.to_owned(), p.to_owned()))?;
        return Some(Credentials { username, password });
    }
    let field = |name: &str| entry.get(name).and_then(|value| value.as_str()).map(str::to_owned);
    Some(Credentials { username: field("username")?, password: field("password")? })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server's error is one short line: a web server's page is named as
    /// one, a long text is cut, the status has its reason.
    #[test]
    fn a_servers_error_is_one_short_line() {
        let url = "http://127.0.0.1:8000/v2/x/manifests/1";
        let page = "<!DOCTYPE HTML>\n<html lang=\"en\">\n<body>\n<h1>Error response</h1>\n</body>\n</html>\n";
        assert_eq!(
            server_error(404, url, page),
            format!("{url} answered 404 Not Found with an HTML page: not an OCI registry's answer")
        );
        assert_eq!(server_error(502, url, "  "), format!("{url} answered 502 Bad Gateway"));
        assert_eq!(server_error(599, url, "upstream\n  gone"), format!("{url} answered 599: upstream gone"));
        let long = "é".repeat(300);
        assert_eq!(
            server_error(500, url, &long),
            format!("{url} answered 500 Internal Server Error: {}…", "é".repeat(200))
        );
    }

    #[test]
    fn loopback_registries_are_told_apart() {
        for registry in ["127.0.0.1:5000", "localhost:5000", "[::1]:5000", "127.0.0.2"] {
            assert!(is_loopback(registry), "{registry}");
        }
        for registry in ["ghcr.io", "10.0.0.1:5000", "localhost.example.com"] {
            assert!(!is_loopback(registry), "{registry}");
        }
    }

    #[test]
    fn a_reference_needs_the_scheme_and_a_real_digest() {
        assert!(parse("127.0.0.1:5000/tools/grep:1").is_err());
        assert!(parse("oci://127.0.0.1:5000/tools/grep:1").is_ok());
        assert!(parse("oci://ghcr.io/acme/grep:1").is_ok());
        assert!(parse("oci://localhost/grep:1").is_ok());
        assert_eq!(
            parse("oci://registry/grep:1").unwrap_err(),
            "no registry named; write its host first, such as oci://ghcr.io/registry/grep:1 or \
             oci://localhost:5000/registry/grep:1"
        );
        assert!(parse("oci://grep:1").unwrap_err().starts_with("no registry named"));
        assert_eq!(
            parse("oci://localhost:5000/tools/grep").unwrap_err(),
            "no tag nor digest named; add one, such as oci://localhost:5000/tools/grep:1.0 or \
             oci://localhost:5000/tools/grep@sha256:…"
        );
        assert!(parse("oci://127.0.0.1:5000/tools/grep@sha256:abc").is_err());
    }

    #[test]
    fn a_push_names_a_tag_not_a_digest() {
        let registries = Registries::new(Path::new("/nonexistent"), &[]);
        let reference = format!("oci://localhost:5000/tools/grep@sha256:{}", "a".repeat(64));
        let error = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(registries.push(&reference, Vec::new()))
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            format!(
                "failed to push {reference}: a push names a tag, such as oci://localhost:5000/tools/grep:1.0, \
                 not a digest: the digest is that of the bytes pushed, and is printed once they are"
            )
        );
    }

    #[test]
    fn credentials_never_show_the_password() {
        let credentials = Credentials { username: "ci".into(), password: "hunter2".into() };
        assert_eq!(format!("{credentials:?}"), "Credentials(ci, ***)");
    }
}
