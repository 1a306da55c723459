//! Plugins from a real OCI registry on the loopback address: published with
//! `keel publish`, pulled by tag and by digest, verified, kept by digest,
//! locked, and authenticated without a credential reaching a log.

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

#[test]
fn a_blob_corrupted_in_the_registry_is_refused() {
    let registry = Registry::start();
    let project = Project::new();
    let tag = format!("oci://{}/tools/echo:corrupt", registry.addr);
    publish(&project, &tag);
    let component = std::fs::read(echo()).unwrap();
    let blob = registry.blob_file(&sha256(&component));
    let mut bytes = std::fs::read(&blob).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&blob, &bytes).unwrap();

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

    // From the environment, logging everything.
    let mut publish = project.command(&["publish", &tag, echo.to_str().unwrap()]);
    publish
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
    let kept =
        project.path().join("cache/oci/blobs/sha256").join(format!("{}.wasm", sha256(layer.as_bytes())));
    assert!(!kept.exists(), "what is not WebAssembly is not kept");
    // Nor is an index, nor its tag: the cache holds the junk manifest alone.
    let manifests: Vec<_> = std::fs::read_dir(project.path().join("cache/oci/blobs/sha256"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(manifests, [sha256(manifest.to_string().as_bytes())], "what is kept");
    let tags = std::fs::read_dir(project.path().join("cache/oci/tags")).unwrap().count();
    assert_eq!(tags, 1, "only junk:1's tag is kept");
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
