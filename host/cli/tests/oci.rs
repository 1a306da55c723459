//! Plugins from a real OCI registry on the loopback address: published with
//! `keel publish`, pulled by tag and by digest, verified, kept by digest,
//! locked, and authenticated without a credential reaching a log.

#[path = "support/fake_registry.rs"]
mod fake_registry;
mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use support::bundled;
use support::registry::Registry;

/// Everything keel, the registry client and its HTTP stack log, at the
/// most detailed level; the compiler's own tracing, which has nothing to
/// do with registries, is left at warnings.
const TRACE: &str =
    "warn,keel=trace,keel_host=trace,oci_client=trace,reqwest=trace,hyper=trace,hyper_util=trace,h2=trace";

const BATCH: &str = r#"[{"type":"tool_use","id":"1","name":"echo","input":{"text":"from the registry"}}]"#;

/// A project directory with a batch for `echo` and a compile cache of its own.
struct Project {
    dir: tempfile::TempDir,
}

impl Project {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("batch.json"), BATCH).unwrap();
        Project { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = support::keel(self.path(), &self.path().join("cache"), args);
        command
            .env("DOCKER_CONFIG", self.path().join("docker"))
            .env_remove("KEEL_REGISTRY")
            .env_remove("KEEL_REGISTRY_USERNAME")
            .env_remove("KEEL_REGISTRY_PASSWORD");
        command
    }

    fn keel(&self, command: &mut Command) -> Output {
        support::run(command, Duration::from_secs(120))
    }

    fn keel_ok(&self, args: &[&str]) -> String {
        support::keel_ok(&mut self.command(args))
    }

    /// `keel run --plugins reference batch.json`: the echo's text.
    fn run_echo(&self, reference: &str) -> String {
        let stdout = self.keel_ok(&["run", "--plugins", reference, "batch.json"]);
        let message: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        message["content"][0]["content"].as_str().unwrap().to_owned()
    }
}

fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(bytes).iter().map(|byte| format!("{byte:02x}")).collect()
}

fn echo() -> PathBuf {
    bundled("echo")
}

/// Publish the bundled echo to `reference`; the `oci://…@sha256:…` printed.
fn publish(project: &Project, reference: &str) -> String {
    let echo = echo();
    project.keel_ok(&["publish", reference, echo.to_str().unwrap()]).trim().to_owned()
}

#[test]
fn a_plugin_is_pulled_by_tag_and_by_digest_and_the_lock_records_the_digest() {
    let registry = Registry::start();
    let publisher = Project::new();
    let tag = format!("oci://{}/tools/echo:1.0", registry.addr);
    let by_digest = publish(&publisher, &tag);
    let digest = by_digest.rsplit_once('@').unwrap().1.to_owned();
    assert_eq!(by_digest, format!("oci://{}/tools/echo@{digest}", registry.addr));
    // The manifest is the wasm artifact layout: a wasm config, one wasm layer.
    let hex = digest.strip_prefix("sha256:").unwrap();
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(registry.blob_file(hex)).unwrap()).unwrap();
    assert_eq!(manifest["config"]["mediaType"], "application/vnd.wasm.config.v0+json");
    let component = std::fs::read(echo()).unwrap();
    assert_eq!(manifest["layers"][0]["mediaType"], "application/wasm");
    assert_eq!(manifest["layers"][0]["digest"], format!("sha256:{}", sha256(&component)));

    let by_tag = Project::new();
    assert_eq!(by_tag.run_echo(&tag), "from the registry");
    let pinned = Project::new();
    assert_eq!(pinned.run_echo(&by_digest), "from the registry");

    // With no cache, what is pulled goes to a temporary directory that is
    // gone when the run ends.
    let uncached = Project::new();
    let temp = uncached.path().join("tmp");
    std::fs::create_dir(&temp).unwrap();
    let mut run = uncached.command(&["run", "--no-cache", "--plugins", &tag, "batch.json"]);
    let stdout = support::keel_ok(run.env("TMPDIR", &temp));
    assert!(stdout.contains("from the registry"), "{stdout}");
    assert_eq!(std::fs::read_dir(&temp).unwrap().count(), 0, "{:?}", walk(&temp));

    by_tag.keel_ok(&["lock", "--plugins", &tag]);
    let lock: toml::Value =
        toml::from_str(&std::fs::read_to_string(by_tag.path().join("keel.lock")).unwrap()).unwrap();
    let entry = &lock["plugin"][0];
    assert_eq!(entry["name"].as_str(), Some("echo"));
    assert_eq!(entry["source"].as_str(), Some(tag.as_str()));
    assert_eq!(entry["resolved"].as_str(), Some(digest.as_str()));
    assert_eq!(entry["sha256"].as_str(), Some(sha256(&component).as_str()));

    // The tag moves on; the locked run still gets the digest it locked.
    let wc = bundled("wc");
    publisher.keel_ok(&["publish", &tag, wc.to_str().unwrap()]);
    let fresh = Project::new();
    std::fs::copy(by_tag.path().join("keel.lock"), fresh.path().join("keel.lock")).unwrap();
    assert_eq!(fresh.run_echo(&tag), "from the registry");
    let output = fresh.keel(&mut fresh.command(&["list", "--plugins", &tag, "--locked"]));
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));

    // A pin a pulled plugin breaks names it by its reference, not by where
    // the store keeps it.
    let wrong = "0".repeat(64);
    let pinning = Project::new();
    std::fs::write(pinning.path().join("keel.toml"), format!("[plugins.echo]\nsha256 = \"{wrong}\"\n"))
        .unwrap();
    let stderr = support::keel_fails(&mut pinning.command(&["list", "--plugins", &by_digest]));
    assert_eq!(
        stderr.trim_end(),
        format!(
            "error: refused plugin {by_digest}: [plugins.echo] pins sha256 {wrong}, but the file's component has \
             sha256 {}",
            sha256(&component)
        )
    );
}

#[test]
fn a_second_start_with_the_registry_stopped_is_served_from_the_cache() {
    let mut registry = Registry::start();
    let project = Project::new();
    let tag = format!("oci://{}/tools/echo:cached", registry.addr);
    let by_digest = publish(&project, &tag);
    assert_eq!(project.run_echo(&tag), "from the registry");
    assert_eq!(project.run_echo(&by_digest), "from the registry");
    registry.stop();
    assert_eq!(project.run_echo(&tag), "from the registry", "the tag's digest and the blobs are kept");
    assert_eq!(project.run_echo(&by_digest), "from the registry");
    // A project that never pulled it cannot reach the stopped registry.
    let output = Project::new().keel(&mut Project::new().command(&["run", "--plugins", &tag, "batch.json"]));
    assert!(!output.status.success());
}

/// Publishes `echo` as `tag`, then flips a byte in the middle of its blob in
/// the registry's storage, so that what a pull gets no longer has its digest.
/// Returns the component as published.
fn publish_corrupted(registry: &Registry, project: &Project, tag: &str) -> Vec<u8> {
    publish(project, tag);
    let component = std::fs::read(echo()).unwrap();
    let blob = registry.blob_file(&sha256(&component));
    let mut bytes = std::fs::read(&blob).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&blob, &bytes).unwrap();
    component
}

#[test]
fn a_blob_corrupted_in_the_registry_is_refused() {
    let registry = Registry::start();
    let project = Project::new();
    let tag = format!("oci://{}/tools/echo:corrupt", registry.addr);
    let component = publish_corrupted(&registry, &project, &tag);

    let fresh = Project::new();
    let output = fresh.keel(&mut fresh.command(&["run", "--plugins", &tag, "batch.json"]));
    assert!(!output.status.success(), "a corrupted blob was run");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.starts_with(&format!("error: failed to pull {tag}: ")), "{stderr}");
    assert!(stderr.contains("digest"), "the refusal names the digest: {stderr}");
    let kept = fresh.path().join("cache/oci/blobs/sha256").join(format!("{}.wasm", sha256(&component)));
    assert!(!kept.exists(), "nothing unverified is kept");
}

#[test]
fn credentials_reach_the_registry_and_never_a_log() {
    let (user, password) = ("keel-ci", "s3cret-Pa55word-not-for-logs");
    let registry = Registry::start_with_auth(Some((user, password)));
    let project = Project::new();
    let tag = format!("oci://{}/private/echo:1", registry.addr);
    let echo = echo();

    // Refused without credentials.
    let output = project.keel(&mut project.command(&["publish", &tag, echo.to_str().unwrap()]));
    assert!(!output.status.success(), "the registry takes anonymous pushes");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.starts_with(&format!("error: failed to push {tag}: ")), "{stderr}");
    assert!(stderr.contains("(credentials: KEEL_REGISTRY_USERNAME and KEEL_REGISTRY_PASSWORD,"), "{stderr}");

    // From the environment, for the registry KEEL_REGISTRY names, logging
    // everything.
    let mut publish = project.command(&["publish", &tag, echo.to_str().unwrap()]);
    publish
        .env("KEEL_REGISTRY", &registry.addr)
        .env("KEEL_REGISTRY_USERNAME", user)
        .env("KEEL_REGISTRY_PASSWORD", password)
        .env("KEEL_LOG", TRACE);
    let published = project.keel(&mut publish);
    assert!(published.status.success(), "{}", String::from_utf8_lossy(&published.stderr));

    // From the Docker configuration file, logging everything.
    use base64::Engine as _;
    let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    let docker = project.path().join("docker");
    std::fs::create_dir_all(&docker).unwrap();
    let config = serde_json::json!({ "auths": { registry.addr.clone(): { "auth": encoded } } });
    std::fs::write(docker.join("config.json"), config.to_string()).unwrap();
    let mut run = project.command(&["run", "--plugins", &tag, "batch.json"]);
    run.env("KEEL_LOG", TRACE);
    let pulled = project.keel(&mut run);
    assert!(pulled.status.success(), "{}", String::from_utf8_lossy(&pulled.stderr));

    for output in [&published, &pulled] {
        let logs = String::from_utf8_lossy(&output.stderr);
        assert!(
            logs.contains(&registry.addr),
            "the requests to the registry are not in the log, so this proves nothing:\n{logs}"
        );
        for secret in [password, encoded.as_str()] {
            assert!(!logs.contains(secret), "a credential reached the log:\n{logs}");
        }
    }
}

/// Put `blobs` and then `manifest` (of `media_type`) under `repo:tag` in
/// `registry` by its HTTP API, as any client could.
fn put_artifact(
    registry: &Registry,
    repo: &str,
    tag: &str,
    blobs: &[&str],
    manifest: &str,
    media_type: &str,
) {
    use support::http::request;
    let addr = registry.addr.parse().unwrap();
    for blob in blobs {
        // An upload begun, then finished with the whole blob and its digest.
        let begun = request(addr, "POST", &format!("/v2/{repo}/blobs/uploads/"), &[], "");
        assert_eq!(begun.status, 202, "{}", begun.body);
        let location = begun.header("location").unwrap();
        let path = location.find("/v2/").map_or(location, |at| &location[at..]);
        let separator = if path.contains('?') { '&' } else { '?' };
        let path = format!("{path}{separator}digest=sha256:{}", sha256(blob.as_bytes()));
        let reply = request(addr, "PUT", &path, &[("content-type", "application/octet-stream")], blob);
        assert_eq!(reply.status, 201, "{}", reply.body);
    }
    let reply = request(
        addr,
        "PUT",
        &format!("/v2/{repo}/manifests/{tag}"),
        &[("content-type", media_type)],
        manifest,
    );
    assert_eq!(reply.status, 201, "{}", reply.body);
}

#[test]
fn what_is_not_a_component_artifact_or_not_there_is_refused_naming_the_reference() {
    let registry = Registry::start();
    let project = Project::new();
    let descriptor = |media_type: &str, blob: &str| serde_json::json!({ "mediaType": media_type, "digest": format!("sha256:{}", sha256(blob.as_bytes())), "size": blob.len() });
    // Typed as a component, but its layer is not WebAssembly.
    let (config, layer) = ("{}", "not WebAssembly");
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": descriptor("application/vnd.wasm.config.v0+json", config),
        "layers": [descriptor("application/wasm", layer)],
    });
    let image = "application/vnd.oci.image.manifest.v1+json";
    put_artifact(&registry, "tools/junk", "1", &[config, layer], &manifest.to_string(), image);
    // An index of platforms, as a container image has.
    let index = r#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[]}"#;
    put_artifact(&registry, "tools/index", "1", &[], index, "application/vnd.oci.image.index.v1+json");

    let at = |name: &str| format!("oci://{}/tools/{name}", registry.addr);
    for (name, said) in [
        ("junk:1", "its application/wasm layer is not a WebAssembly file (no `\\0asm` header)"),
        (
            "index:1",
            "it is an image index (a manifest for each platform), not a WebAssembly component artifact",
        ),
        ("junk:2", &format!("the registry {} has no tools/junk:2", registry.addr)),
        ("nothing:1", &format!("the registry {} has no tools/nothing:1", registry.addr)),
    ] {
        let output = project.keel(&mut project.command(&["run", "--plugins", &at(name), "batch.json"]));
        assert_eq!(output.status.code(), Some(1), "{name}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(stderr, format!("error: failed to pull {}: {said}\n", at(name)), "{name}");
    }
    // Nothing is kept of a pull that failed: not the junk's manifest, nor
    // any tag, nor what is not WebAssembly.
    let kept = project.path().join("cache/oci");
    let files: Vec<_> = walk(&kept);
    assert!(files.is_empty(), "kept after failed pulls: {files:?}");
}

/// The files under `dir`, if it exists.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries
        .map(|entry| entry.unwrap().path())
        .flat_map(|path| if path.is_dir() { walk(&path) } else { vec![path] })
        .collect()
}

#[test]
fn a_registry_nothing_answers_at_is_named_with_the_reason() {
    // A loopback port just freed: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let project = Project::new();
    let reference = format!("oci://127.0.0.1:{port}/tools/echo:1");
    let output = project.keel(&mut project.command(&["run", "--plugins", &reference, "batch.json"]));
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        format!(
            "error: failed to pull {reference}: could not connect to the registry 127.0.0.1:{port}: \
             Connection refused (os error 111)\n"
        )
    );
}

/// The manifest of a component artifact whose layer has `digest` and
/// declares `size`; its config is `{}`.
fn artifact_manifest(digest: &str, size: u64) -> String {
    serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.wasm.config.v0+json",
            "digest": format!("sha256:{}", sha256(b"{}")),
            "size": 2,
        },
        "layers": [{ "mediaType": "application/wasm", "digest": digest, "size": size }],
    })
    .to_string()
}

const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";

/// `keel run --plugins reference` in a fresh project with `env`; its exit
/// status and stderr.
fn run_failing(reference: &str, env: &[(&str, &str)]) -> (Option<i32>, String) {
    let project = Project::new();
    let mut command = project.command(&["run", "--plugins", reference, "batch.json"]);
    command.envs(env.iter().copied());
    let output = project.keel(&mut command);
    (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned())
}

/// A manifest that never ends is refused once it passes 4 MiB, naming the
/// reference and the manifest, rather than read into memory to its end.
#[test]
fn an_endless_manifest_is_refused_at_4_mib() {
    use fake_registry::{Answer, FakeRegistry};
    let registry = FakeRegistry::start(|request| {
        if request.path.contains("/manifests/") {
            let head = br#"{"schemaVersion":2,"x":""#.to_vec();
            Answer::Endless { content_type: MANIFEST_TYPE, head, limit: 64 << 20 }
        } else {
            Answer::json(200, "{}")
        }
    });
    let reference = format!("oci://{}/tools/echo:1", registry.addr);
    let (code, stderr) = run_failing(&reference, &[]);
    assert_eq!(code, Some(1));
    assert_eq!(
        stderr,
        format!(
            "error: failed to pull {reference}: the manifest is larger than 4 MiB, the most keel reads\n"
        )
    );
}

/// A blob that goes on past the size its manifest declares is refused as
/// soon as it does, and nothing is kept.
#[test]
fn a_component_longer_than_its_manifest_declares_is_refused() {
    use fake_registry::{Answer, FakeRegistry};
    let component = std::fs::read(echo()).unwrap();
    let digest = format!("sha256:{}", sha256(&component));
    let manifest = artifact_manifest(&digest, component.len() as u64);
    let registry = FakeRegistry::start(move |request| {
        if request.path.contains("/manifests/") {
            Answer::Full(
                200,
                vec![("content-type".into(), MANIFEST_TYPE.into())],
                manifest.clone().into_bytes(),
            )
        } else if request.path.contains("/blobs/") {
            let head = b"\0asm".to_vec();
            Answer::Endless { content_type: "application/octet-stream", head, limit: 64 << 20 }
        } else {
            Answer::json(200, "{}")
        }
    });
    let reference = format!("oci://{}/tools/echo:1", registry.addr);
    let project = Project::new();
    let output = project.keel(&mut project.command(&["run", "--plugins", &reference, "batch.json"]));
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        format!(
            "error: failed to pull {reference}: the component blob is larger than the {} bytes its manifest \
             declares\n",
            component.len()
        )
    );
    assert_eq!(walk(&project.path().join("cache/oci")), Vec::<PathBuf>::new(), "nothing is kept");
}

/// A manifest that declares a component over the most keel takes is
/// refused before the component is asked for.
#[test]
fn a_component_declared_over_the_maximum_is_never_asked_for() {
    use fake_registry::{Answer, FakeRegistry};
    let digest = format!("sha256:{}", "a".repeat(64));
    let manifest = artifact_manifest(&digest, 1 << 30);
    let registry = FakeRegistry::start(move |request| {
        if request.path.contains("/manifests/") {
            Answer::Full(
                200,
                vec![("content-type".into(), MANIFEST_TYPE.into())],
                manifest.clone().into_bytes(),
            )
        } else if request.path.contains("/blobs/") {
            Answer::Endless { content_type: "application/octet-stream", head: Vec::new(), limit: 64 << 20 }
        } else {
            Answer::json(200, "{}")
        }
    });
    let reference = format!("oci://{}/tools/echo:1", registry.addr);
    let (code, stderr) = run_failing(&reference, &[]);
    assert_eq!(code, Some(1));
    assert_eq!(
        stderr,
        format!(
            "error: failed to pull {reference}: its manifest declares a component of 1073741824 bytes, more \
             than the 256 MiB keel takes\n"
        )
    );
    assert!(!registry.seen().iter().any(|request| request.path.contains("/blobs/")), "{:?}", registry.seen());
}

/// `KEEL_REGISTRY_USERNAME` and `KEEL_REGISTRY_PASSWORD` go to the registry
/// `KEEL_REGISTRY` names and to no other: without it a refused pull says to
/// set it, and nothing carried them.
#[test]
fn environment_credentials_go_only_to_the_registry_keel_registry_names() {
    use fake_registry::{Answer, FakeRegistry};
    let registry = FakeRegistry::start(|_| Answer::challenge(r#"Basic realm="fake""#));
    let reference = format!("oci://{}/private/echo:1", registry.addr);
    let credentials = [("KEEL_REGISTRY_USERNAME", "keel-ci"), ("KEEL_REGISTRY_PASSWORD", "s3cret")];

    let (code, stderr) = run_failing(&reference, &credentials);
    assert_eq!(code, Some(1));
    assert!(
        stderr.ends_with(&format!(
            " (KEEL_REGISTRY_USERNAME and KEEL_REGISTRY_PASSWORD are set but were not sent: they go only to \
             the registry KEEL_REGISTRY names; set KEEL_REGISTRY={} to send them to this one)\n",
            registry.addr
        )),
        "{stderr}"
    );
    let other = [credentials[0], credentials[1], ("KEEL_REGISTRY", "ghcr.io")];
    let (code, stderr) = run_failing(&reference, &other);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("go only to KEEL_REGISTRY, ghcr.io, not 127.0.0.1:"), "{stderr}");
    let sent: Vec<_> =
        registry.seen().into_iter().filter(|request| request.authorization.is_some()).collect();
    assert!(sent.is_empty(), "credentials reached a registry KEEL_REGISTRY does not name: {sent:?}");

    let named = [credentials[0], credentials[1], ("KEEL_REGISTRY", registry.addr.as_str())];
    run_failing(&reference, &named);
    use base64::Engine as _;
    let basic = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode("keel-ci:s3cret"));
    assert!(
        registry.seen().iter().any(|request| request.authorization.as_deref() == Some(basic.as_str())),
        "the named registry got no credentials: {:?}",
        registry.seen()
    );
}

/// A registry whose challenge sends the credentials to a token service over
/// plain HTTP on another host is refused before anything is sent there.
#[test]
fn credentials_go_to_no_token_service_over_plain_http() {
    use fake_registry::{Answer, FakeRegistry};
    // An address of documentation's, which nothing answers at.
    let realm = "http://192.0.2.1/token";
    let registry =
        FakeRegistry::start(move |_| Answer::challenge(&format!(r#"Bearer realm="{realm}",service="x""#)));
    let reference = format!("oci://{}/private/echo:1", registry.addr);
    let env = [
        ("KEEL_REGISTRY", registry.addr.as_str()),
        ("KEEL_REGISTRY_USERNAME", "keel-ci"),
        ("KEEL_REGISTRY_PASSWORD", "s3cret"),
    ];
    let (code, stderr) = run_failing(&reference, &env);
    assert_eq!(code, Some(1));
    assert_eq!(
        stderr,
        format!(
            "error: failed to pull {reference}: the registry {} asks for credentials to be sent to its token \
             service {realm} over plain HTTP; refused: keel sends them over plain HTTP only to a loopback host \
             or one `[registries] insecure` names\n",
            registry.addr
        )
    );
    assert!(registry.seen().iter().all(|request| request.authorization.is_none()), "{:?}", registry.seen());
}

/// A bearer challenge is met as a registry expects: the credentials to the
/// token service it names (here on the loopback address), with the
/// repository's scope, and the token to the registry.
#[test]
fn a_token_service_gets_the_credentials_and_the_registry_the_token() {
    use base64::Engine as _;
    use fake_registry::{Answer, FakeRegistry};
    let component = std::fs::read(echo()).unwrap();
    let digest = format!("sha256:{}", sha256(&component));
    let manifest = artifact_manifest(&digest, component.len() as u64);
    let basic = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode("keel-ci:s3cret"));
    let addr = std::sync::Arc::new(std::sync::OnceLock::<String>::new());
    let registry = FakeRegistry::start({
        let addr = addr.clone();
        move |request| {
            if request.path.starts_with("/token") {
                return if request.authorization.as_deref() == Some(basic.as_str()) {
                    Answer::json(200, r#"{"token":"tok-123"}"#)
                } else {
                    Answer::json(401, "{}")
                };
            }
            if request.authorization.as_deref() != Some("Bearer tok-123") {
                let realm = format!("http://{}/token", addr.get().unwrap());
                return Answer::challenge(&format!(r#"Bearer realm="{realm}",service="fake""#));
            }
            if request.path.contains("/manifests/") {
                Answer::Full(
                    200,
                    vec![("content-type".into(), MANIFEST_TYPE.into())],
                    manifest.clone().into_bytes(),
                )
            } else if request.path.ends_with(&digest) {
                Answer::Full(200, vec![], component.clone())
            } else {
                Answer::json(404, r#"{"errors":[{"code":"BLOB_UNKNOWN","message":"no"}]}"#)
            }
        }
    });
    addr.set(registry.addr.clone()).unwrap();
    let reference = format!("oci://{}/tools/echo:1", registry.addr);
    let project = Project::new();
    let mut run = project.command(&["run", "--plugins", &reference, "batch.json"]);
    run.env("KEEL_REGISTRY", &registry.addr)
        .env("KEEL_REGISTRY_USERNAME", "keel-ci")
        .env("KEEL_REGISTRY_PASSWORD", "s3cret");
    let output = project.keel(&mut run);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let seen = registry.seen();
    let token = seen.iter().find(|request| request.path.starts_with("/token")).expect("a token request");
    assert!(token.path.contains("scope=repository%3Atools%2Fecho%3Apull"), "{}", token.path);
    assert!(token.path.contains("service=fake"), "{}", token.path);
    for request in seen.iter().filter(|request| !request.path.starts_with("/token") && request.path != "/v2/")
    {
        assert_eq!(request.authorization.as_deref(), Some("Bearer tok-123"), "{request:?}");
    }
}

/// A pull that failed keeps neither the tag nor the manifest: once the
/// registry's tag is fixed, the next run with the same cache gets the fix
/// rather than the broken manifest it saw first.
#[test]
fn a_failed_pull_does_not_poison_the_cache() {
    let registry = Registry::start();
    let project = Project::new();
    let tag = format!("oci://{}/tools/echo:poison", registry.addr);
    publish_corrupted(&registry, &project, &tag);
    let output = project.keel(&mut project.command(&["run", "--plugins", &tag, "batch.json"]));
    assert!(!output.status.success(), "a corrupted blob was run");
    assert_eq!(
        walk(&project.path().join("cache/oci")),
        Vec::<PathBuf>::new(),
        "a failed pull kept something"
    );

    // The tag is fixed: it now names another component, whole.
    let wc = bundled("wc");
    project.keel_ok(&["publish", &tag, wc.to_str().unwrap()]);
    let listed = project.keel_ok(&["list", "--plugins", &tag]);
    assert!(listed.contains("wc"), "{listed}");
}
