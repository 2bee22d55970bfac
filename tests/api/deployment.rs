//! What can be checked of the Docker stack without a Docker engine: the files
//! parse, name only files that exist, agree with config/docker.toml, and the
//! dashboard queries only metrics the service exports.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use hourglass::Settings;
use secrecy::ExposeSecret;
use serde_json::Value as Json;
use serde_norway::Value as Yaml;

use crate::helpers::*;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn yaml(path: &str) -> Yaml {
    let text = std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{path} does not parse: {e}"))
}

fn compose() -> Yaml {
    yaml("docker-compose.yml")
}

fn service<'a>(compose: &'a Yaml, name: &str) -> &'a Yaml {
    compose["services"]
        .get(name)
        .unwrap_or_else(|| panic!("no service {name}"))
}

fn docker_settings() -> Settings {
    Settings::load_file(&root().join("config/docker.toml")).expect("config/docker.toml is valid")
}

/// `(host, port)` of a `scheme://host:port/...` URL.
fn host_port(url: &str) -> (String, u16) {
    let rest = url.split("://").nth(1).expect("a scheme");
    let authority = rest.split(['/', '?']).next().expect("an authority");
    let (host, port) = authority.rsplit_once(':').expect("a port");
    (host.to_owned(), port.parse().expect("a numeric port"))
}

#[test]
fn every_file_the_compose_stack_mounts_exists() {
    let compose = compose();
    let services = compose["services"].as_mapping().expect("services");
    for expected in ["mongo", "mosquitto", "hourglass", "prometheus", "grafana"] {
        assert!(services.contains_key(expected), "service {expected}");
    }
    let mut mounted = 0;
    for (name, svc) in services {
        for volume in svc["volumes"].as_sequence().into_iter().flatten() {
            let spec = volume.as_str().expect("short volume syntax");
            let source = spec.split(':').next().expect("a source");
            if source.starts_with("./") {
                assert!(
                    root().join(source).exists(),
                    "{name:?} mounts {source}, which is missing"
                );
                mounted += 1;
            }
        }
    }
    assert!(
        mounted >= 6,
        "the stack mounts the project's configuration files"
    );
    assert!(root().join("Dockerfile").exists());
    assert_eq!(service(&compose, "hourglass")["build"].as_str(), Some("."));
}

#[test]
fn the_hourglass_service_agrees_with_its_configuration() {
    let compose = compose();
    let hg = service(&compose, "hourglass");
    let settings = docker_settings();
    // The container listens where the port mapping points.
    let ports: Vec<&str> = hg["ports"]
        .as_sequence()
        .expect("ports")
        .iter()
        .filter_map(Yaml::as_str)
        .collect();
    let container_port = settings.http.listen.port();
    assert!(
        ports
            .iter()
            .any(|p| p.ends_with(&format!(":{container_port}"))),
        "{ports:?} vs {container_port}"
    );
    assert!(
        settings.http.listen.ip().is_unspecified(),
        "reachable from other containers"
    );
    // The config it mounts is the one checked here.
    let volumes: Vec<&str> = hg["volumes"]
        .as_sequence()
        .expect("volumes")
        .iter()
        .filter_map(Yaml::as_str)
        .collect();
    assert!(
        volumes
            .iter()
            .any(|v| v.starts_with("./config/docker.toml:")),
        "{volumes:?}"
    );
    // The journal outlives the container: a named volume at journal.dir.
    let journal = format!(":{}", settings.journal.dir.display());
    assert!(
        settings.journal.enabled
            && volumes
                .iter()
                .any(|v| v.ends_with(&journal) && !v.starts_with('.')),
        "{volumes:?} vs {journal}"
    );
    // Storage and broker are services of the stack, on their own ports.
    let (db_host, db_port) = host_port(settings.mongodb.uri.expose_secret());
    assert_eq!((db_host.as_str(), db_port), ("mongo", 27017));
    assert!(
        service(&compose, &db_host)["healthcheck"].is_mapping(),
        "MongoDB has a healthcheck"
    );
    assert!(
        service(&compose, &db_host)["volumes"]
            .as_sequence()
            .is_some_and(|v| !v.is_empty()),
        "a data volume"
    );
    let (mq_host, mq_port) = host_port(&settings.mqtt.url);
    assert_eq!(mq_host, "mosquitto");
    let broker = service(&compose, &mq_host);
    assert!(
        broker["command"]
            .as_sequence()
            .expect("command")
            .iter()
            .any(|c| c
                .as_str()
                .is_some_and(|s| s.contains(&format!("listener {mq_port} ")))),
        "the broker listens on the port hourglass dials"
    );
    assert_eq!(settings.log.format, hourglass::LogFormat::Json);
    // Prometheus scrapes that address.
    let prom = yaml("config/prometheus.yml");
    let targets: Vec<&str> = prom["scrape_configs"][0]["static_configs"][0]["targets"]
        .as_sequence()
        .expect("targets")
        .iter()
        .filter_map(Yaml::as_str)
        .collect();
    assert_eq!(targets, vec![format!("hourglass:{container_port}")]);
    assert_eq!(
        prom["scrape_configs"][0]["metrics_path"].as_str(),
        Some("/metrics")
    );
}

#[test]
fn the_sharded_profile_runs_three_instances_behind_a_load_balancer() {
    let compose = compose();
    let instances = ["hourglass-a", "hourglass-b", "hourglass-c"];
    for name in [
        "configsvr",
        "shard1",
        "shard2",
        "mongos",
        "sharding-init",
        "lb",
    ]
    .into_iter()
    .chain(instances)
    {
        let profiles = service(&compose, name)["profiles"]
            .as_sequence()
            .expect("profiles");
        assert!(
            profiles.iter().any(|p| p.as_str() == Some("sharded")),
            "{name}"
        );
    }
    let mut client_ids = BTreeSet::new();
    let mut journals = BTreeSet::new();
    for name in instances {
        let svc = service(&compose, name);
        let env = &svc["environment"];
        assert_eq!(
            env["HOURGLASS__MQTT__SHARED_GROUP"].as_str(),
            Some("hourglass")
        );
        assert!(
            env["HOURGLASS__MONGODB__URI"]
                .as_str()
                .is_some_and(|u| u.starts_with("mongodb://mongos:27017/")),
            "{name} writes through mongos"
        );
        client_ids.insert(
            env["HOURGLASS__MQTT__CLIENT_ID"]
                .as_str()
                .expect("client id"),
        );
        let journal = svc["volumes"]
            .as_sequence()
            .expect("volumes")
            .iter()
            .filter_map(Yaml::as_str)
            .find(|v| v.ends_with(":/var/lib/hourglass/journal"))
            .expect("a journal volume");
        journals.insert(journal);
    }
    assert_eq!(client_ids.len(), 3, "distinct MQTT client ids");
    assert_eq!(journals.len(), 3, "a journal volume each");
    let nginx = std::fs::read_to_string(root().join("config/nginx.conf")).expect("nginx.conf");
    for name in instances {
        assert!(
            nginx.contains(&format!("server {name}:8080;")),
            "the load balancer sends to {name}"
        );
    }
}

/// `(collection, key)` of every `sh.shardCollection` in the init script.
fn shard_keys() -> Vec<(String, String)> {
    let script =
        std::fs::read_to_string(root().join("config/mongo/init-sharding.js")).expect("script");
    script
        .lines()
        .filter_map(|l| l.strip_prefix("sh.shardCollection(\"hourglass."))
        .map(|rest| {
            let (collection, rest) = rest.split_once('"').expect("a name");
            let key = rest.trim_start_matches(", ");
            let key = &key[..=key.find('}').expect("a key")];
            (collection.to_owned(), key.to_owned())
        })
        .collect()
}

/// The key of an index as the init script writes it: `{ a: 1, b: 1 }`.
fn key_text(key: &mongodb::bson::Document) -> String {
    let fields: Vec<String> = key
        .iter()
        .map(|(k, v)| match v {
            mongodb::bson::Bson::String(s) => format!("{k}: \"{s}\""),
            other => format!(
                "{k}: {}",
                other.as_i32().map_or(other.to_string(), |x| x.to_string())
            ),
        })
        .collect();
    format!("{{ {} }}", fields.join(", "))
}

#[tokio::test]
async fn every_collection_written_by_upsert_is_sharded_on_a_unique_index_the_service_creates() {
    let keys = shard_keys();
    let names: Vec<&str> = keys.iter().map(|(c, _)| c.as_str()).collect();
    assert_eq!(names, ["buckets", "rollups", "sensors"]);
    let page = "docs/src/operating/scaling-out.md";
    let docs = std::fs::read_to_string(root().join(page)).expect(page);
    let app = spawn_app().await;
    for (collection, key) in &keys {
        assert!(docs.contains(key.as_str()), "{page} documents {key}");
        if collection == "sensors" {
            // Hashed `_id`: every registry write names its `_id`.
            assert_eq!(key, r#"{ _id: "hashed" }"#);
            continue;
        }
        // A unique index on a sharded collection must start with the shard
        // key; here it is the key: the one the service's upserts name.
        let mut cursor = app
            .db
            .collection::<mongodb::bson::Document>(collection)
            .list_indexes()
            .await
            .expect("indexes");
        let mut unique = Vec::new();
        while let Some(index) = futures_util::TryStreamExt::try_next(&mut cursor)
            .await
            .expect("an index")
        {
            if index.options.and_then(|o| o.unique) == Some(true) {
                unique.push(key_text(&index.keys));
            }
        }
        assert!(unique.contains(key), "{collection}: {unique:?} vs {key}");
    }
    app.stop().await.expect("stops");
}

/// Metric names in PromQL expressions: `hourglass_…` identifiers.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = expr;
    while let Some(i) = rest.find("hourglass_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

#[tokio::test]
async fn the_dashboard_queries_only_metrics_the_service_exports() {
    let path = root().join("config/grafana/dashboards/hourglass.json");
    let dash: Json = serde_json::from_str(&std::fs::read_to_string(&path).expect("dashboard"))
        .expect("valid JSON");
    let datasources = yaml("config/grafana/provisioning/datasources/prometheus.yml");
    let uid = datasources["datasources"][0]["uid"]
        .as_str()
        .expect("a datasource uid");
    assert_eq!(
        datasources["datasources"][0]["url"].as_str(),
        Some("http://prometheus:9090")
    );
    let provider = yaml("config/grafana/provisioning/dashboards/hourglass.yml");
    assert_eq!(
        provider["providers"][0]["options"]["path"].as_str(),
        Some("/var/lib/grafana/dashboards")
    );

    let mut wanted = BTreeSet::new();
    let mut titles = Vec::new();
    for panel in dash["panels"].as_array().expect("panels") {
        titles.push(panel["title"].as_str().expect("title").to_lowercase());
        assert_eq!(
            panel["datasource"]["uid"].as_str(),
            Some(uid),
            "panel {}",
            panel["title"]
        );
        for target in panel["targets"].as_array().expect("targets") {
            wanted.extend(metric_names(target["expr"].as_str().expect("expr")));
        }
    }
    for topic in [
        "ingest rate",
        "reject",
        "flush latency",
        "pending",
        "storage errors",
        "mqtt",
    ] {
        assert!(
            titles.iter().any(|t| t.contains(topic)),
            "a panel for {topic}: {titles:?}"
        );
    }

    // Traffic first: labelled series appear once they have been observed.
    let app = spawn_app().await;
    let t = base_time();
    assert_eq!(
        app.post_readings(&reading("dash", "m", t, 1.0))
            .await
            .status(),
        200
    );
    let range = format!("from={}&to={}", rfc3339(t), rfc3339(t + 600));
    app.get_json(&format!("/api/v1/sensors/dash/average?metric=m&{range}"))
        .await;
    app.get_json(&format!(
        "/api/v1/sensors/dash/series?metric=m&{range}&step=5m"
    ))
    .await;
    app.get("/metrics").await;
    let text = app.get("/metrics").await.text().await.expect("metrics");
    let exported: BTreeSet<String> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.split(['{', ' ']).next().expect("a name").to_owned())
        .collect();
    let declared: BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .map(str::to_owned)
        .collect();
    for name in &wanted {
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .unwrap_or(name);
        assert!(
            exported.contains(name) || declared.contains(family),
            "the dashboard queries {name}, which /metrics does not export"
        );
    }
    assert!(wanted.len() >= 10, "{wanted:?}");
    let mut alerts = BTreeSet::new();
    for group in yaml("config/alerts.yml")["groups"]
        .as_sequence()
        .expect("groups")
    {
        for rule in group["rules"].as_sequence().expect("rules") {
            alerts.extend(metric_names(rule["expr"].as_str().expect("expr")));
        }
    }
    assert!(alerts.len() >= 8, "{alerts:?}");
    for name in &alerts {
        assert!(
            declared.contains(name),
            "the alert rules use {name}, which /metrics does not declare"
        );
    }
    app.stop().await.expect("clean stop");
}

/// The alert rules load in Prometheus 2's `promtool`, fire on the series
/// their unit tests give (`config/alerts.test.yml`) and not on a healthy
/// instance; the compose stack's Prometheus loads them.
#[test]
fn the_alert_rules_pass_promtool_and_their_unit_tests() {
    let promtool = crate::prom::binary("promtool");
    for args in [
        ["check", "rules", "alerts.yml"],
        ["test", "rules", "alerts.test.yml"],
    ] {
        let out = std::process::Command::new(&promtool)
            .args(args)
            .current_dir(root().join("config"))
            .output()
            .expect("promtool runs (make test installs Prometheus)");
        assert!(
            out.status.success(),
            "promtool {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let prometheus = yaml("config/prometheus.yml");
    assert_eq!(
        prometheus["rule_files"][0].as_str(),
        Some("/etc/prometheus/alerts.yml")
    );
    let compose = std::fs::read_to_string(root().join("docker-compose.yml")).expect("compose");
    assert!(compose.contains("./config/alerts.yml:/etc/prometheus/alerts.yml:ro"));
}

#[test]
fn the_dockerfile_builds_in_stages_and_runs_as_a_non_root_user() {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Dockerfile"))
        .expect("Dockerfile");
    assert!(
        text.matches("\nFROM ").count() + usize::from(text.starts_with("FROM ")) >= 2,
        "multi-stage"
    );
    assert!(
        text.contains("COPY --from=build"),
        "copies only the binary out of the build stage"
    );
    let user = text
        .lines()
        .filter_map(|l| l.strip_prefix("USER "))
        .next_back()
        .expect("a USER line");
    assert_ne!(user.trim(), "root");
}

/// Copies `from` (a file or a directory) to `to`, leaving out what
/// `.dockerignore` names (paths relative to the context's root).
fn copy_context(root: &Path, from: &Path, to: &Path, ignored: &[String]) {
    let relative = from.strip_prefix(root).expect("inside the context");
    if ignored
        .iter()
        .any(|i| relative.starts_with(i.trim_end_matches('/')))
    {
        return;
    }
    if from.is_dir() {
        std::fs::create_dir_all(to).expect("a directory");
        for entry in std::fs::read_dir(from).expect("a listing") {
            let entry = entry.expect("an entry");
            copy_context(root, &entry.path(), &to.join(entry.file_name()), ignored);
        }
    } else {
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent).expect("a directory");
        }
        std::fs::copy(from, to).expect("copied");
    }
}

/// The image's build context, rebuilt as Docker would (exactly the files
/// the Dockerfile copies, less what `.dockerignore` names), and the
/// Dockerfile's text.
fn image_context() -> (tempfile::TempDir, String) {
    let root = root();
    let dockerfile = std::fs::read_to_string(root.join("Dockerfile")).expect("Dockerfile");
    let ignored: Vec<String> = std::fs::read_to_string(root.join(".dockerignore"))
        .unwrap_or_default()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect();
    let context = tempfile::tempdir().expect("a temporary directory");
    let mut copies = 0;
    for line in dockerfile.lines() {
        let Some(args) = line.strip_prefix("COPY ") else {
            continue;
        };
        if args.starts_with("--from") {
            continue;
        }
        let parts: Vec<&str> = args.split_whitespace().collect();
        let (dest, sources) = parts.split_last().expect("COPY <src>... <dest>");
        for source in sources {
            let from = root.join(source);
            assert!(
                from.exists(),
                "the Dockerfile copies {source}, which is not there"
            );
            let to = if dest.ends_with('/') {
                context
                    .path()
                    .join(dest)
                    .join(Path::new(source).file_name().expect("a name"))
            } else if dest.starts_with('/') {
                // The runtime stage's copies land in the image, not in the
                // build's directory: they only need to exist.
                continue;
            } else {
                context.path().join(dest)
            };
            copy_context(&root, &from, &to, &ignored);
            copies += 1;
        }
    }
    assert!(copies >= 4, "{copies} copies");
    (context, dockerfile)
}

/// The image's build context, rebuilt as Docker would (exactly the files the
/// Dockerfile copies, less what `.dockerignore` names), loads as the
/// workspace its build command builds, against the lock file: a workspace
/// member, a declared target or a configuration file left out fails here,
/// not on an adopter's machine (no Docker engine needed).
#[test]
fn the_dockerfiles_build_context_loads_as_the_workspace_it_builds() {
    let (context, dockerfile) = image_context();
    // What the image's build downloads first: every crate of the lock file,
    // other platforms' included (cached after the first run).
    let out = std::process::Command::new(env!("CARGO"))
        .args(["fetch", "--locked"])
        .current_dir(context.path())
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "the image's build context does not fetch: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = std::process::Command::new(env!("CARGO"))
        .args(["metadata", "--locked", "--offline", "--format-version", "1"])
        .current_dir(context.path())
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "the image's build context does not load: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metadata: Json = serde_json::from_slice(&out.stdout).expect("metadata");
    let members = metadata["workspace_members"].as_array().expect("members");
    assert!(!members.is_empty());
    // Every target of every member is there to build.
    for package in metadata["packages"].as_array().expect("packages") {
        if !members.contains(&package["id"]) {
            continue;
        }
        for target in package["targets"].as_array().expect("targets") {
            let path = target["src_path"].as_str().expect("a path");
            assert!(Path::new(path).exists(), "{path} is not in the context");
        }
    }
    assert!(
        dockerfile.contains("cargo build --release --locked --bin hourglass"),
        "the build command this test stands for"
    );
}

/// The image's build command, checked (type-checked, not code-generated)
/// from its context alone, offline against the registry the suite's build
/// fetched: a module, a build script or an included file left out fails
/// here. Minutes while its dependencies are unchecked, so `make test` runs
/// it in a phase of its own (`--run-ignored only`), with both cores; the
/// repository's target directory keeps their checks between runs.
#[test]
#[ignore = "run by `make test` in a phase of its own"]
fn the_dockerfiles_build_command_checks_from_its_context_alone() {
    let (context, _) = image_context();
    let fetched = std::process::Command::new(env!("CARGO"))
        .args(["fetch", "--locked"])
        .current_dir(context.path())
        .status()
        .expect("cargo runs");
    assert!(
        fetched.success(),
        "the image's build context does not fetch"
    );
    let out = std::process::Command::new(env!("CARGO"))
        .args(["check", "--locked", "--offline", "--bin", "hourglass"])
        .current_dir(context.path())
        .env(
            "CARGO_TARGET_DIR",
            root().join("target").join("docker-context"),
        )
        .env("HOURGLASS_COMMIT", "unknown")
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "the image's build fails from its context: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every command line the compose stack gives the Hourglass image parses,
/// and the configuration it names (the mounted file, the service's
/// environment) is one the binary starts with: `hourglass check-config`
/// with the container's paths mapped to the files mounted there. The
/// stack's Prometheus configuration passes `promtool check config`.
#[test]
fn every_hourglass_command_line_of_the_compose_stack_parses_and_its_configuration_is_valid() {
    let compose = compose();
    let mut checked = 0;
    for (name, svc) in compose["services"].as_mapping().expect("services") {
        let name = name.as_str().expect("a name");
        let image = svc["image"].as_str().unwrap_or("");
        if !image.starts_with("hourglass") {
            continue;
        }
        // Container path -> the project file mounted there.
        let mounts: Vec<(String, PathBuf)> = svc["volumes"]
            .as_sequence()
            .into_iter()
            .flatten()
            .filter_map(Yaml::as_str)
            .filter_map(|v| {
                let mut parts = v.split(':');
                let (from, to) = (parts.next()?, parts.next()?);
                from.starts_with("./")
                    .then(|| (to.to_owned(), root().join(from)))
            })
            .collect();
        let args: Vec<String> = svc["command"]
            .as_sequence()
            .unwrap_or_else(|| panic!("{name} has a command"))
            .iter()
            .map(|a| {
                let a = a.as_str().expect("a string");
                mounts
                    .iter()
                    .find(|(to, _)| to == a)
                    .map_or_else(|| a.to_owned(), |(_, from)| from.display().to_string())
            })
            .collect();
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_hourglass"));
        cmd.args(&args).arg("check-config");
        // Only the container's environment: none of the suite's.
        for (key, _) in std::env::vars() {
            if key.starts_with("HOURGLASS__") {
                cmd.env_remove(key);
            }
        }
        for (key, value) in svc["environment"].as_mapping().into_iter().flatten() {
            cmd.env(
                key.as_str().expect("a name"),
                value
                    .as_str()
                    .map_or_else(|| format!("{value:?}"), str::to_owned),
            );
        }
        let out = cmd.output().expect("the binary runs");
        assert!(
            out.status.success(),
            "{name}: hourglass {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        checked += 1;
    }
    assert!(
        checked >= 4,
        "the single and the sharded profile's instances: {checked}"
    );

    let dir = tempfile::tempdir().expect("a temporary directory");
    let config = std::fs::read_to_string(root().join("config/prometheus.yml"))
        .expect("config/prometheus.yml")
        .replace(
            "/etc/prometheus/alerts.yml",
            &root().join("config/alerts.yml").display().to_string(),
        );
    let file = dir.path().join("prometheus.yml");
    std::fs::write(&file, config).expect("written");
    let out = std::process::Command::new("promtool")
        .args(["check", "config"])
        .arg(&file)
        .output()
        .expect("promtool runs; `make test` installs it");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
