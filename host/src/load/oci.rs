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
//! - a manifest is read to [`MAX_MANIFEST_SIZE`] and a component to the
//!   size its manifest declares, which is at most [`MAX_COMPONENT_SIZE`];
//!   a registry that goes quiet is given up after [`CONNECT_TIMEOUT`] to
//!   connect and [`READ_TIMEOUT`] between reads;
//! - a tag is resolved to a manifest digest once and the answer kept under
//!   `oci/tags/`, so a second start makes no network request at all; a
//!   lock pins the digest itself ([`Resolve::Pinned`]), and `keel lock`
//!   resolves tags afresh ([`Resolve::Fresh`]). The tag and the manifest
//!   are kept only once the component is verified and kept, so a failed
//!   pull leaves nothing a later one would trust.
//!
//! Registries on the loopback address are spoken to over plain HTTP, any
//! other over HTTPS unless `[registries] insecure` names it. Credentials
//! come from `KEEL_REGISTRY_USERNAME` and `KEEL_REGISTRY_PASSWORD` for the
//! registry `KEEL_REGISTRY` names alone, else from the Docker
//! configuration file (`$DOCKER_CONFIG/config.json`, else
//! `~/.docker/config.json`, its `auths` entry for the registry). keel reads
//! the registry's challenge and makes the token exchange itself, so that
//! credentials never go to a token service over plain HTTP unless it is on
//! the loopback address or `[registries] insecure` names it; they are never
//! logged, and no error carries them.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use futures::StreamExt as _;
use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};
use oci_client::errors::{DigestError, OciDistributionError};
use oci_client::manifest::{
    OCI_IMAGE_INDEX_MEDIA_TYPE, OCI_IMAGE_MEDIA_TYPE, OciDescriptor, OciImageManifest,
};
use oci_client::secrets::RegistryAuth;
use oci_client::token_cache::RegistryToken;
use oci_client::{Client, Reference};

use crate::error::{Error, Result};
use crate::load::lock::{is_sha256_hex, sha256_hex};

/// The config media type of a WebAssembly component artifact.
pub const WASM_CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";
/// The layer media type of the component itself.
pub const WASM_LAYER_MEDIA_TYPE: &str = "application/wasm";
/// The scheme of a plugin reference.
pub const SCHEME: &str = "oci://";

/// The largest manifest keel reads: 4 MiB, the bound the OCI distribution
/// specification suggests a registry hold manifests to. A larger one, or an
/// answer that never ends, is refused as soon as it passes the bound.
pub const MAX_MANIFEST_SIZE: usize = 4 << 20;

/// The largest component keel pulls: 256 MiB, far above any tool's (the
/// bundled ones are a few MiB) and small enough to hold in memory while it
/// is verified. A manifest that declares a larger layer is refused before
/// the layer is asked for, and a blob is read no further than the size its
/// manifest declares.
pub const MAX_COMPONENT_SIZE: u64 = 256 << 20;

/// How long connecting to a registry (or its token service) may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a registry may leave a request without a byte of its answer,
/// before the first and between any two.
pub const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The most of an error answer or a token answer keel reads.
const MAX_SMALL_ANSWER: usize = 64 << 10;

/// The registry whose credentials `KEEL_REGISTRY_USERNAME` and
/// `KEEL_REGISTRY_PASSWORD` are.
const REGISTRY_VARIABLE: &str = "KEEL_REGISTRY";

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
    connect_timeout: Duration,
    read_timeout: Duration,
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

/// What a session is for: the scope of the token it asks for.
#[derive(Clone, Copy)]
enum Operation {
    Pull,
    Push,
}

impl Registries {
    /// Keep pulled blobs under `cache_dir/oci`; speak plain HTTP to the
    /// registries of `insecure` (`host:port`) and to loopback ones.
    pub fn new(cache_dir: &Path, insecure: &[String]) -> Self {
        Registries {
            dir: cache_dir.join("oci"),
            insecure: insecure.to_vec(),
            connect_timeout: CONNECT_TIMEOUT,
            read_timeout: READ_TIMEOUT,
        }
    }

    /// Pull the component `reference` names (`oci://…`), or find it where
    /// it was kept; its tag resolved as `resolve` says.
    pub async fn pull(&self, reference: &str, resolve: Resolve<'_>) -> Result<Pulled> {
        let fail =
            |reason: String| Error::Registry { action: "pull", reference: reference.to_owned(), reason };
        let parsed = parse(reference).map_err(fail)?;
        self.pull_parsed(&parsed, resolve).await.map_err(fail)
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
        let session = self.session(&parsed, Operation::Push).await.map_err(fail)?;
        let client = &session.client;
        let [layer] = layers;
        let pushed = async {
            client.push_blob(&parsed, layer.data, &manifest.layers[0].digest).await?;
            client.push_blob(&parsed, config.data, &manifest.config.digest).await?;
            // The manifest is sent as the very bytes its digest was taken of.
            let content_type = http::HeaderValue::from_static(OCI_IMAGE_MEDIA_TYPE);
            client.push_manifest_raw(&parsed, text, content_type).await
        };
        pushed.await.map_err(|error| fail(session.describe(&error)))?;
        Ok(digest)
    }

    async fn pull_parsed(&self, reference: &Reference, resolve: Resolve<'_>) -> Result<Pulled, String> {
        // The manifest digest, when it is known without asking the registry.
        let known = match (reference.digest(), resolve) {
            (_, Resolve::Pinned(digest)) | (Some(digest), _) => Some(digest.to_owned()),
            (None, Resolve::Cached) => self.cached_tag(reference),
            (None, Resolve::Fresh) => None,
        };
        let kept = match &known {
            Some(digest) => self.kept_manifest(digest)?,
            None => None,
        };
        if let (Some(digest), Some(raw)) = (&known, &kept) {
            let layer = wasm_layer(raw)?;
            let layer_hex = digest_hex(&layer.digest)?;
            let file = self.blob_path(&layer.digest, ".wasm");
            if file.is_file() {
                return Ok(Pulled { file, manifest: digest.clone(), sha256: layer_hex.to_owned() });
            }
        }
        let session = self.session(reference, Operation::Pull).await?;
        let resolved_now = known.is_none();
        let (digest, raw) = match (known, kept) {
            (Some(digest), Some(raw)) => (digest, raw),
            (Some(digest), None) => {
                let raw = session.manifest(&reference.clone_with_digest(digest.clone())).await?;
                let actual = sha256_hex(&raw);
                if actual != digest_hex(&digest)? {
                    return Err(format!("the manifest has digest sha256:{actual}, not {digest}"));
                }
                (digest, raw)
            }
            (None, _) => {
                let raw = session.manifest(reference).await?;
                (format!("sha256:{}", sha256_hex(&raw)), raw)
            }
        };
        let layer = wasm_layer(&raw)?;
        let layer_hex = digest_hex(&layer.digest)?.to_owned();
        let file = self.blob_path(&layer.digest, ".wasm");
        if !file.is_file() {
            let bytes = session.component(reference, &layer).await?;
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
        // Only now, with the component verified and kept, the manifest and
        // the tag: a pull that failed leaves none to be trusted by the next.
        self.keep(&self.blob_path(&digest, ""), &raw)?;
        if resolved_now {
            self.keep(&self.tag_path(reference), digest.as_bytes())?;
        }
        Ok(Pulled { file, manifest: digest, sha256: layer_hex })
    }

    /// The manifest `digest` names, if it is kept and matches it.
    fn kept_manifest(&self, digest: &str) -> Result<Option<Vec<u8>>, String> {
        let hex = digest_hex(digest)?;
        Ok(std::fs::read(self.blob_path(digest, "")).ok().filter(|raw| sha256_hex(raw) == hex))
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

    /// Whether `authority` (`host[:port]`) is spoken to over plain HTTP.
    fn plain(&self, authority: &str) -> bool {
        is_loopback(authority) || self.insecure.iter().any(|entry| entry == authority)
    }

    /// A session with the registry of `reference`, authorized for
    /// `operation` as its challenge asks.
    async fn session(&self, reference: &Reference, operation: Operation) -> Result<Session, String> {
        // reqwest's rustls needs a process-wide provider: the one the
        // egress path uses. Another installed first is as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let registry = reference.resolve_registry().to_owned();
        let plain = self.plain(&registry);
        let protocol =
            if plain { ClientProtocol::HttpsExcept(vec![registry.clone()]) } else { ClientProtocol::Https };
        let mut session = Session {
            scheme: if plain { "http" } else { "https" },
            connect_timeout: self.connect_timeout,
            read_timeout: self.read_timeout,
            client: Client::default(),
            http: reqwest::Client::new(),
            auth: RegistryAuth::Anonymous,
            registry,
        };
        let config = ClientConfig {
            protocol,
            connect_timeout: Some(self.connect_timeout),
            read_timeout: Some(self.read_timeout),
            ..ClientConfig::default()
        };
        session.client = Client::try_from(config).map_err(|error| session.describe(&error))?;
        // Redirects as reqwest follows them (it drops the credentials of
        // a request sent on to another host or scheme), never to plain
        // HTTP from HTTPS.
        let redirects = reqwest::redirect::Policy::custom(|attempt| {
            let downgrade = attempt.url().scheme() == "http"
                && attempt.previous().iter().any(|url| url.scheme() == "https");
            if attempt.previous().len() >= 10 {
                attempt.error("more than 10 redirects")
            } else if downgrade {
                attempt.error("a redirect from HTTPS to plain HTTP")
            } else {
                attempt.follow()
            }
        });
        session.http = reqwest::Client::builder()
            .connect_timeout(self.connect_timeout)
            .read_timeout(self.read_timeout)
            .redirect(redirects)
            .user_agent(concat!("keel/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|error| session.describe_request(&error))?;
        session.auth = self.authorize(&session, reference, operation).await?;
        session.client.store_auth_if_needed(&session.registry, &session.auth).await;
        Ok(session)
    }

    /// How the session's requests are authorized: the registry's challenge
    /// read from a bare `GET /v2/`, and for a bearer challenge the token
    /// exchange made here, the credentials sent to the token service only
    /// over HTTPS or to one spoken to over plain HTTP by choice.
    async fn authorize(
        &self,
        session: &Session,
        reference: &Reference,
        operation: Operation,
    ) -> Result<RegistryAuth, String> {
        let credentials = credentials(&session.registry);
        let url = format!("{}://{}/v2/", session.scheme, session.registry);
        let answer = session.http.get(&url).send().await.map_err(|error| session.describe_request(&error))?;
        let header =
            answer.headers().get(http::header::WWW_AUTHENTICATE).and_then(|value| value.to_str().ok());
        let Some(challenge) = header.map(Challenge::parse) else {
            // No challenge: the registry takes requests as they come.
            return Ok(RegistryAuth::Anonymous);
        };
        drop(answer);
        let Challenge::Bearer { realm, service } = challenge else {
            return Ok(match credentials {
                Some(Credentials { username, password }) => RegistryAuth::Basic(username, password),
                None => RegistryAuth::Anonymous,
            });
        };
        let realm_url = reqwest::Url::parse(&realm)
            .map_err(|error| format!("the registry's token service {realm:?} is no URL: {error}"))?;
        if credentials.is_some() {
            self.check_realm(&session.registry, &realm_url)?;
        }
        let scope = match operation {
            Operation::Pull => format!("repository:{}:pull", reference.repository()),
            Operation::Push => format!("repository:{}:pull,push", reference.repository()),
        };
        let mut query = vec![("scope", scope)];
        query.extend(service.map(|service| ("service", service)));
        let mut request = session.http.get(realm_url).query(&query);
        if let Some(Credentials { username, password }) = &credentials {
            request = request.basic_auth(username, Some(password));
        }
        let answer = request.send().await.map_err(|error| session.describe_request(&error))?;
        let status = answer.status();
        let body = read_bounded(answer, MAX_SMALL_ANSWER)
            .await
            .map_err(|error| session.describe_request(&error))?
            .ok_or_else(|| {
                format!("the token service {realm} answered more than {MAX_SMALL_ANSWER} bytes")
            })?;
        if status != reqwest::StatusCode::OK {
            let said = server_error(status.as_u16(), &realm, &String::from_utf8_lossy(&body));
            return Err(format!("the token service refused: {said}{}", refused_hint(&session.registry)));
        }
        let token: RegistryToken = serde_json::from_slice(&body)
            .map_err(|error| format!("the token service {realm} answered no token: {error}"))?;
        Ok(RegistryAuth::Bearer(token.token().to_owned()))
    }

    /// Whether credentials may go to the token service at `realm`: over
    /// HTTPS, or plain HTTP to a loopback host or one `[registries]
    /// insecure` names.
    fn check_realm(&self, registry: &str, realm: &reqwest::Url) -> Result<(), String> {
        let host = realm.host_str().unwrap_or_default();
        let authority = realm.port().map_or_else(|| host.to_owned(), |port| format!("{host}:{port}"));
        match realm.scheme() {
            "https" => Ok(()),
            "http" if self.plain(&authority) => Ok(()),
            scheme => Err(format!(
                "the registry {registry} asks for credentials to be sent to its token service {realm} \
                 over {}; refused: keel sends them over plain HTTP only to a loopback host or one \
                 `[registries] insecure` names",
                if scheme == "http" { "plain HTTP".to_owned() } else { format!("{scheme}:") }
            )),
        }
    }

    /// The same, with `connect` and `read` for timeouts: the tests' short
    /// ones.
    #[cfg(test)]
    fn with_timeouts(mut self, connect: Duration, read: Duration) -> Self {
        self.connect_timeout = connect;
        self.read_timeout = read;
        self
    }
}

/// What a registry's `WWW-Authenticate` asks for.
#[derive(Debug, PartialEq, Eq)]
enum Challenge {
    /// A token from the service at `realm`.
    Bearer { realm: String, service: Option<String> },
    /// Anything else: HTTP basic authentication, as oci-client takes it.
    Other,
}

impl Challenge {
    /// The challenge of the header `value`: its first bearer challenge
    /// with a realm, else [`Challenge::Other`].
    fn parse(value: &str) -> Challenge {
        // Each challenge is a scheme followed by `name=value` parameters,
        // a value a token or a quoted string, all separated by commas.
        let mut challenges: Vec<(String, Vec<(String, String)>)> = Vec::new();
        let mut rest = value;
        loop {
            rest = rest.trim_start_matches(|c: char| c == ',' || c.is_whitespace());
            if rest.is_empty() {
                break;
            }
            let end = rest.find(|c: char| c == ',' || c == '=' || c.is_whitespace()).unwrap_or(rest.len());
            let (name, after) = rest.split_at(end);
            let after = after.trim_start();
            if name.is_empty() {
                // A stray `=`: skip it.
                rest = &after[1.min(after.len())..];
                continue;
            }
            let Some(value_text) = after.strip_prefix('=') else {
                challenges.push((name.to_owned(), Vec::new()));
                rest = after;
                continue;
            };
            let value_text = value_text.trim_start();
            let (param, remaining) = match value_text.strip_prefix('"') {
                Some(quoted) => {
                    let mut param = String::new();
                    let mut chars = quoted.char_indices();
                    let mut end = quoted.len();
                    while let Some((at, c)) = chars.next() {
                        match c {
                            '\\' => param.extend(chars.next().map(|(_, escaped)| escaped)),
                            '"' => {
                                end = at + 1;
                                break;
                            }
                            c => param.push(c),
                        }
                    }
                    (param, &quoted[end..])
                }
                None => {
                    let end =
                        value_text.find(|c: char| c == ',' || c.is_whitespace()).unwrap_or(value_text.len());
                    (value_text[..end].to_owned(), &value_text[end..])
                }
            };
            if let Some((_, params)) = challenges.last_mut() {
                params.push((name.to_ascii_lowercase(), param));
            }
            rest = remaining;
        }
        challenges
            .into_iter()
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .find_map(|(_, params)| {
                let find =
                    |key: &str| params.iter().find(|(name, _)| name == key).map(|(_, value)| value.clone());
                Some(Challenge::Bearer { realm: find("realm")?, service: find("service") })
            })
            .unwrap_or(Challenge::Other)
    }
}

/// One operation's connection to one registry: oci-client for blobs and
/// pushes, reqwest for the manifest and the token exchange, both with the
/// timeouts, and the authorization the registry's challenge called for.
struct Session {
    registry: String,
    scheme: &'static str,
    connect_timeout: Duration,
    read_timeout: Duration,
    client: Client,
    http: reqwest::Client,
    auth: RegistryAuth,
}

impl Session {
    /// The manifest `reference` names, read to [`MAX_MANIFEST_SIZE`] and,
    /// when the registry names its digest, checked against it.
    async fn manifest(&self, reference: &Reference) -> Result<Vec<u8>, String> {
        let version = match (reference.digest(), reference.tag()) {
            (Some(digest), _) => digest.to_owned(),
            (None, tag) => tag.unwrap_or("latest").to_owned(),
        };
        let url =
            format!("{}://{}/v2/{}/manifests/{version}", self.scheme, self.registry, reference.repository());
        let request = self.http.get(&url).header(http::header::ACCEPT, MANIFEST_TYPES.join(", "));
        let request = match &self.auth {
            RegistryAuth::Anonymous => request,
            RegistryAuth::Basic(username, password) => request.basic_auth(username, Some(password)),
            RegistryAuth::Bearer(token) => request.bearer_auth(token),
        };
        let answer = request.send().await.map_err(|error| self.describe_request(&error))?;
        let status = answer.status();
        let said_digest = answer
            .headers()
            .get("docker-content-digest")
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        if status != reqwest::StatusCode::OK {
            let body = read_bounded(answer, MAX_SMALL_ANSWER).await.ok().flatten().unwrap_or_default();
            let error = registry_error(status, &url, &body);
            return Err(describe_manifest_pull(&error, reference, &self.describe(&error)));
        }
        let raw = read_bounded(answer, MAX_MANIFEST_SIZE)
            .await
            .map_err(|error| self.describe_request(&error))?
            .ok_or_else(|| {
                format!("the manifest is larger than {} MiB, the most keel reads", MAX_MANIFEST_SIZE >> 20)
            })?;
        if let Some(said) = said_digest.filter(|said| said.starts_with("sha256:")) {
            let actual = format!("sha256:{}", sha256_hex(&raw));
            if said != actual {
                return Err(format!("the registry says the manifest has digest {said}, but it has {actual}"));
            }
        }
        Ok(raw)
    }

    /// The component `layer` of `reference`, read no further than the size
    /// the manifest declares (checked against [`MAX_COMPONENT_SIZE`] before
    /// it is asked for). The caller checks its digest.
    async fn component(&self, reference: &Reference, layer: &OciDescriptor) -> Result<Vec<u8>, String> {
        let declared =
            u64::try_from(layer.size).ok().filter(|size| *size <= MAX_COMPONENT_SIZE).ok_or_else(|| {
                format!(
                    "its manifest declares a component of {} bytes, more than the {} MiB keel takes",
                    layer.size,
                    MAX_COMPONENT_SIZE >> 20
                )
            })?;
        let too_large =
            || format!("the component blob is larger than the {declared} bytes its manifest declares");
        let mut stream =
            self.client.pull_blob_stream(reference, layer).await.map_err(|error| self.describe(&error))?;
        if stream.content_length.is_some_and(|length| length > declared) {
            return Err(too_large());
        }
        let mut bytes = Vec::with_capacity(usize::try_from(declared.min(16 << 20)).unwrap_or_default());
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(chunk) => {
                    if (bytes.len() + chunk.len()) as u64 > declared {
                        return Err(too_large());
                    }
                    bytes.extend_from_slice(&chunk);
                }
                // oci-client's own check of the digest, at the end: the
                // caller's says it in keel's words.
                Err(error) if error.get_ref().is_some_and(|inner| inner.is::<DigestError>()) => {
                    if sha256_hex(&bytes) == digest_hex(&layer.digest)? {
                        return Err(format!("the component blob: {}", chain(&error)));
                    }
                    break;
                }
                Err(error) => return Err(self.describe_io(&error)),
            }
        }
        Ok(bytes)
    }

    /// [`Session::describe_request`] of the request error inside `error`,
    /// else `error` in one line.
    fn describe_io(&self, error: &std::io::Error) -> String {
        match request_error(error) {
            Some(request) => self.describe_request(request),
            None => chain(error),
        }
    }

    /// A failed request in one line: one that timed out says so, naming
    /// the registry; one that could not connect names the registry and the
    /// innermost cause (`Connection refused`), the layers above it only
    /// repeating that a request failed.
    fn describe_request(&self, request: &reqwest::Error) -> String {
        let at = request.url().map_or_else(
            || self.registry.clone(),
            |url| {
                let host = url.host_str().unwrap_or_default();
                url.port_or_known_default().map_or_else(|| host.to_owned(), |port| format!("{host}:{port}"))
            },
        );
        let who = if at == self.registry || request.url().is_none() {
            format!("the registry {at}")
        } else {
            format!("{at} (the token service of the registry {})", self.registry)
        };
        if request.is_timeout() {
            return if request.is_connect() {
                format!("could not connect to {who}: timed out after {:?}", self.connect_timeout)
            } else {
                format!("{who} timed out: no answer within {:?}", self.read_timeout)
            };
        }
        if request.is_connect() {
            let mut cause: &dyn std::error::Error = request;
            while let Some(inner) = cause.source() {
                cause = inner;
            }
            return format!("could not connect to {who}: {cause}");
        }
        chain(request)
    }

    /// The error of the client, in one line; a refusal for want of
    /// credentials says where keel takes them from. It never holds
    /// credentials: the client sends them in headers, which its errors do
    /// not quote.
    fn describe(&self, error: &OciDistributionError) -> String {
        use oci_client::errors::OciDistributionError as E;
        let request = match error {
            E::RequestError(request) => Some(request),
            E::IoError(io) => request_error(io),
            _ => None,
        };
        if let Some(request) = request.filter(|request| request.is_timeout() || request.is_connect()) {
            return self.describe_request(request);
        }
        let mut text = match error {
            E::ServerError { code, url, message } => server_error(*code, url, message),
            _ => chain(error),
        };
        if matches!(
            error,
            E::UnauthorizedError { .. }
                | E::AuthenticationFailure(_)
                | E::ServerError { code: 401 | 403, .. }
        ) {
            text.push_str(&refused_hint(&self.registry));
        }
        text
    }
}

/// The whole answer, if it is at most `limit` bytes: `None` as soon as it
/// passes the bound, whatever its `Content-Length` says or does not.
async fn read_bounded(
    mut answer: reqwest::Response,
    limit: usize,
) -> Result<Option<Vec<u8>>, reqwest::Error> {
    if answer.content_length().is_some_and(|length| length > limit as u64) {
        return Ok(None);
    }
    let mut bytes = Vec::new();
    while let Some(chunk) = answer.chunk().await? {
        if bytes.len() + chunk.len() > limit {
            return Ok(None);
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(Some(bytes))
}

/// The error a registry's answer of `status` with `body` is, as oci-client
/// tells them apart.
fn registry_error(status: reqwest::StatusCode, url: &str, body: &[u8]) -> OciDistributionError {
    use oci_client::errors::OciEnvelope;
    let url = url.to_owned();
    if status == reqwest::StatusCode::UNAUTHORIZED {
        return OciDistributionError::UnauthorizedError { url };
    }
    if status.is_client_error()
        && let Ok(envelope) = serde_json::from_slice::<OciEnvelope>(body)
    {
        return OciDistributionError::RegistryError { envelope, url };
    }
    let message = String::from_utf8_lossy(body).into_owned();
    OciDistributionError::ServerError { code: status.as_u16(), url, message }
}

/// The request error somewhere inside `error`, as oci-client and reqwest
/// wrap them (an I/O error of a stream holds one).
fn request_error<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a reqwest::Error> {
    let mut current = Some(error);
    while let Some(error) = current {
        if let Some(request) = error.downcast_ref::<reqwest::Error>() {
            return Some(request);
        }
        current = match error.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()) {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => error.source(),
        };
    }
    None
}

/// `error` and its sources in one line, a source left out when the text
/// already says it (oci-client's errors often quote their source).
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let said = cause.to_string();
        if !text.contains(&said) {
            text = format!("{text}: {said}");
        }
        source = cause.source();
    }
    text
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

/// `described`, the description of a failed pull of the manifest
/// `reference` names, unless the registry has no such manifest: then that,
/// in words.
fn describe_manifest_pull(error: &OciDistributionError, reference: &Reference, described: &str) -> String {
    use oci_client::errors::{OciDistributionError as E, OciErrorCode as Code};
    let unknown = |code: &Code| matches!(code, Code::ManifestUnknown | Code::NameUnknown | Code::NotFound);
    let missing = match error {
        E::RegistryError { envelope, .. } => envelope.errors.iter().any(|error| unknown(&error.code)),
        E::ImageManifestNotFoundError(_) => true,
        _ => false,
    };
    if !missing {
        return described.to_owned();
    }
    let version = match (reference.digest(), reference.tag()) {
        (Some(digest), _) => format!("@{digest}"),
        (None, tag) => format!(":{}", tag.unwrap_or("latest")),
    };
    format!("the registry {} has no {}{version}", reference.resolve_registry(), reference.repository())
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

/// Where a request `registry` refused could have taken credentials from
/// (README, "Plugins from registries"), and why the environment's were not
/// sent when they were not.
fn refused_hint(registry: &str) -> String {
    let from_env = std::env::var_os("KEEL_REGISTRY_USERNAME").is_some()
        && std::env::var_os("KEEL_REGISTRY_PASSWORD").is_some();
    match std::env::var(REGISTRY_VARIABLE) {
        _ if !from_env => {}
        Err(_) => {
            return format!(
                " (KEEL_REGISTRY_USERNAME and KEEL_REGISTRY_PASSWORD are set but were not sent: they go \
                 only to the registry {REGISTRY_VARIABLE} names; set {REGISTRY_VARIABLE}={registry} to send \
                 them to this one)"
            );
        }
        Ok(named) if named != registry => {
            return format!(
                " (KEEL_REGISTRY_USERNAME and KEEL_REGISTRY_PASSWORD go only to {REGISTRY_VARIABLE}, \
                 {named}, not {registry}; else the registry's entry in the Docker configuration file)"
            );
        }
        Ok(_) => {}
    }
    format!(
        " (credentials: KEEL_REGISTRY_USERNAME and KEEL_REGISTRY_PASSWORD, for the registry \
         {REGISTRY_VARIABLE} names, else the registry's entry in the Docker configuration file)"
    )
}

/// The credentials for `registry`: the environment's when
/// `KEEL_REGISTRY` names it, else the Docker configuration file's.
fn credentials(registry: &str) -> Option<Credentials> {
    if let (Ok(username), Ok(password), Ok(named)) = (
        std::env::var("KEEL_REGISTRY_USERNAME"),
        std::env::var("KEEL_REGISTRY_PASSWORD"),
        std::env::var(REGISTRY_VARIABLE),
    ) && named == registry
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

    /// A loopback listener that takes connections and never answers, for
    /// 5 s at most; its address.
    fn silent_registry() -> std::net::SocketAddr {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        listener.set_nonblocking(true).unwrap();
        std::thread::spawn(move || {
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            let mut held = Vec::new();
            while std::time::Instant::now() < deadline {
                match listener.accept() {
                    Ok((stream, _)) => held.push(stream),
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        addr
    }

    fn block_on<T>(future: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(future)
    }

    /// A registry that takes the connection and then says nothing is given
    /// up after the read timeout, the error naming it and saying so.
    #[test]
    fn a_registry_that_stops_answering_times_out() {
        let addr = silent_registry();
        let cache = tempfile::tempdir().unwrap();
        let registries = Registries::new(cache.path(), &[])
            .with_timeouts(Duration::from_secs(1), Duration::from_millis(300));
        let reference = format!("oci://{addr}/tools/echo:1");
        let pulled = block_on(async {
            tokio::time::timeout(Duration::from_secs(4), registries.pull(&reference, Resolve::Cached)).await
        });
        let error = pulled.expect("the pull gave up on its own").unwrap_err();
        assert_eq!(
            error.to_string(),
            format!("failed to pull {reference}: the registry {addr} timed out: no answer within 300ms")
        );
    }

    /// A registry whose listen queue is full drops the connection's SYN: the
    /// connect timeout ends the wait, naming the registry.
    #[test]
    fn a_registry_that_never_accepts_times_out_connecting() {
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        socket.bind(&"127.0.0.1:0".parse::<std::net::SocketAddr>().unwrap().into()).unwrap();
        socket.listen(0).unwrap();
        let addr = socket.local_addr().unwrap().as_socket().unwrap();
        // Fill the queue, which is never accepted from.
        let _queued: Vec<_> = (0..4)
            .filter_map(|_| std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok())
            .collect();
        let cache = tempfile::tempdir().unwrap();
        let registries = Registries::new(cache.path(), &[])
            .with_timeouts(Duration::from_millis(300), Duration::from_secs(1));
        let reference = format!("oci://{addr}/tools/echo:1");
        let pulled = block_on(async {
            tokio::time::timeout(Duration::from_secs(4), registries.pull(&reference, Resolve::Cached)).await
        });
        let error = pulled.expect("the pull gave up on its own").unwrap_err().to_string();
        assert_eq!(
            error,
            format!(
                "failed to pull {reference}: could not connect to the registry {addr}: timed out after 300ms"
            ),
        );
    }

    #[test]
    fn the_timeouts_are_the_named_ones() {
        let registries = Registries::new(Path::new("/nonexistent"), &[]);
        assert_eq!((registries.connect_timeout, registries.read_timeout), (CONNECT_TIMEOUT, READ_TIMEOUT));
    }

    /// A digest error that quotes its source says it once.
    #[test]
    fn an_error_that_quotes_its_source_says_it_once() {
        let (expected, actual) = (format!("sha256:{}", "a".repeat(64)), format!("sha256:{}", "b".repeat(64)));
        let error = OciDistributionError::DigestError(DigestError::VerificationError {
            expected: expected.clone(),
            actual: actual.clone(),
        });
        assert_eq!(chain(&error), format!("Digest error: Invalid digest. Expected {expected}, got {actual}"));
        let io = std::io::Error::other(DigestError::VerificationError { expected, actual });
        assert_eq!(chain(&OciDistributionError::IoError(io)).matches("Invalid digest").count(), 1);
    }

    #[test]
    fn a_challenge_is_read_as_a_registry_writes_it() {
        let bearer = |realm: &str, service: Option<&str>| Challenge::Bearer {
            realm: realm.to_owned(),
            service: service.map(str::to_owned),
        };
        assert_eq!(
            Challenge::parse(
                r#"Bearer realm="https://ghcr.io/token",service="ghcr.io",scope="repository:a/b:pull""#
            ),
            bearer("https://ghcr.io/token", Some("ghcr.io"))
        );
        assert_eq!(
            Challenge::parse(r#"Basic realm="x", bearer Realm="http://a/t\"q", service=svc"#),
            bearer(r#"http://a/t"q"#, Some("svc"))
        );
        assert_eq!(Challenge::parse(r#"Basic realm="keel-tests""#), Challenge::Other);
        assert_eq!(Challenge::parse(r#"Bearer service="x""#), Challenge::Other);
        assert_eq!(Challenge::parse("Bearer realm=\"\u{1}\u{2},,,=\""), bearer("\u{1}\u{2},,,=", None));
        assert_eq!(Challenge::parse("=,= \"=\""), Challenge::Other);
    }

    /// Credentials go to a token service over HTTPS, or over plain HTTP to a
    /// loopback host or one `[registries] insecure` names, and nowhere else.
    #[test]
    fn credentials_go_to_no_token_service_over_plain_http() {
        let registries = Registries::new(Path::new("/nonexistent"), &["registry.internal:5000".to_owned()]);
        let check =
            |realm: &str| registries.check_realm("r.example:5000", &reqwest::Url::parse(realm).unwrap());
        for allowed in [
            "https://auth.example/token",
            "http://127.0.0.1:5000/token",
            "http://localhost/token",
            "http://[::1]:80/token",
            "http://registry.internal:5000/token",
        ] {
            assert_eq!(check(allowed), Ok(()), "{allowed}");
        }
        assert_eq!(
            check("http://auth.example/token").unwrap_err(),
            "the registry r.example:5000 asks for credentials to be sent to its token service \
             http://auth.example/token over plain HTTP; refused: keel sends them over plain HTTP only to \
             a loopback host or one `[registries] insecure` names"
        );
        for refused in ["http://registry.internal/token", "http://registry.internal:5001/t", "ftp://a/t"] {
            assert!(check(refused).is_err(), "{refused}");
        }
    }

    #[test]
    fn credentials_never_show_the_password() {
        let credentials = Credentials { username: "ci".into(), password: "hunter2".into() };
        assert_eq!(format!("{credentials:?}"), "Credentials(ci, ***)");
    }
}
