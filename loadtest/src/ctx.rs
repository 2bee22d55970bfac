//! What every scenario shares: where Hourglass, MongoDB and the broker are.

use std::path::PathBuf;

use anyhow::Context as _;

use crate::procs::{HourglassSpec, Proc, spawn_hourglass};

#[derive(clap::Args, Clone, Debug)]
pub struct Global {
    /// MongoDB-compatible server (spawned Hourglass instances and verify use it).
    #[arg(long, env = "MONGODB_URI", global = true)]
    pub mongodb_uri: Option<String>,
    /// MQTT broker, for `fleet --transport mqtt`.
    #[arg(long, env = "MQTT_URL", global = true)]
    pub mqtt_url: Option<String>,
    /// The hourglass binary to spawn (default: target/release/hourglass, else target/debug/hourglass).
    #[arg(long, env = "HOURGLASS_BIN", global = true)]
    pub hourglass_bin: Option<PathBuf>,
    /// Use this running Hourglass instead of spawning one (its CPU is then not measured).
    #[arg(long, global = true)]
    pub url: Option<String>,
    /// Database of the running Hourglass given with --url.
    #[arg(long, default_value = "hourglass", global = true)]
    pub database: String,
    /// Print the report as JSON.
    #[arg(long, global = true)]
    pub json: bool,
    /// Report name: files go to <results-dir>/<name>/.
    #[arg(long, global = true)]
    pub name: Option<String>,
    #[arg(long, default_value = "loadtest/results", global = true)]
    pub results_dir: PathBuf,
    /// Print only; write no report files.
    #[arg(long, global = true)]
    pub no_files: bool,
    /// No progress bars.
    #[arg(long, global = true)]
    pub quiet: bool,
}

pub struct Ctx {
    pub global: Global,
    /// Makes database names unique per run.
    pub run: String,
}

/// A Hourglass to load: spawned (and measured) or given.
pub struct Target {
    pub url: String,
    pub database: String,
    pub proc: Option<Proc>,
}

impl Target {
    /// Kills the instance started for it (see [`Proc::kill`]).
    pub fn kill(self) {
        if let Some(p) = self.proc {
            p.kill();
        }
    }

    pub fn cpu(&self) -> Option<f64> {
        self.proc.as_ref().map(Proc::cpu)
    }

    /// The service's peak resident memory so far (MiB).
    pub fn peak_rss_mib(&self) -> Option<f64> {
        self.proc
            .as_ref()
            .map(|p| crate::procs::peak_rss_mib(p.pid))
    }
}

impl Ctx {
    pub fn mongodb_uri(&self) -> anyhow::Result<String> {
        self.global
            .mongodb_uri
            .clone()
            .context("set --mongodb-uri or MONGODB_URI")
    }

    pub fn hourglass_bin(&self) -> PathBuf {
        if let Some(b) = &self.global.hourglass_bin {
            return b.clone();
        }
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
        let release = root.join("target/release/hourglass");
        if release.exists() {
            release
        } else {
            root.join("target/debug/hourglass")
        }
    }

    pub fn database(&self, what: &str) -> String {
        format!("lt_{}_{what}", self.run)
    }

    /// The Hourglass to load: `--url`, or a fresh one on its own database.
    pub async fn target(
        &self,
        what: &str,
        granularity: &'static str,
        mqtt: bool,
        journal: bool,
    ) -> anyhow::Result<Target> {
        self.target_with(what, granularity, mqtt, journal, Vec::new())
            .await
    }

    /// [`Ctx::target`] with further `HOURGLASS__…` settings.
    pub async fn target_with(
        &self,
        what: &str,
        granularity: &'static str,
        mqtt: bool,
        journal: bool,
        extra: Vec<(String, String)>,
    ) -> anyhow::Result<Target> {
        self.spawn_target(what, granularity, mqtt, journal, extra, None)
            .await
    }

    /// [`Ctx::target`] with a configuration file's text (MQTT routes).
    pub async fn target_configured(
        &self,
        what: &str,
        granularity: &'static str,
        mqtt: bool,
        journal: bool,
        config: Option<String>,
    ) -> anyhow::Result<Target> {
        self.spawn_target(what, granularity, mqtt, journal, Vec::new(), config)
            .await
    }

    async fn spawn_target(
        &self,
        what: &str,
        granularity: &'static str,
        mqtt: bool,
        journal: bool,
        mut extra: Vec<(String, String)>,
        config: Option<String>,
    ) -> anyhow::Result<Target> {
        if let Some(url) = &self.global.url {
            return Ok(Target {
                url: url.clone(),
                database: self.global.database.clone(),
                proc: None,
            });
        }
        let database = self.database(what);
        let spec = HourglassSpec {
            bin: self.hourglass_bin(),
            mongodb_uri: self.mongodb_uri()?,
            database: database.clone(),
            granularity,
            mqtt_url: if mqtt {
                Some(
                    self.global
                        .mqtt_url
                        .clone()
                        .context("set --mqtt-url or MQTT_URL")?,
                )
            } else {
                None
            },
            extra: {
                extra.push(("HOURGLASS__JOURNAL__ENABLED".into(), journal.to_string()));
                extra
            },
            config,
        };
        let proc = spawn_hourglass(&spec).await?;
        Ok(Target {
            url: proc.url.clone(),
            database,
            proc: Some(proc),
        })
    }

    pub fn bar(&self, len: u64, what: &str) -> indicatif::ProgressBar {
        if self.global.quiet || self.global.json {
            return indicatif::ProgressBar::hidden();
        }
        let bar = indicatif::ProgressBar::new(len);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg:>12} [{bar:40}] {pos}/{len} {per_sec} eta {eta}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        bar.set_message(what.to_owned());
        bar
    }
}

/// [`long_running`], or with the journal on (as shipped) only the age:
/// acknowledgements come from the journal, and queries keep the default
/// timeout a user has.
pub fn long_running_with(max_age_days: u32, journal: bool) -> Vec<(String, String)> {
    if journal {
        return vec![(
            "HOURGLASS__INGEST__MAX_AGE".into(),
            format!("{max_age_days}d"),
        )];
    }
    long_running(max_age_days)
}

/// Settings for a service loaded with long history on the stand-in server:
/// readings up to `max_age_days` old, and room for slow flushes and queries.
pub fn long_running(max_age_days: u32) -> Vec<(String, String)> {
    vec![
        (
            "HOURGLASS__INGEST__MAX_AGE".into(),
            format!("{max_age_days}d"),
        ),
        // Acknowledgements wait for storage (the journal is off), and the
        // stand-in takes tens of seconds per flush here: a request must
        // outlive its flush, or every retry writes the same readings again.
        ("HOURGLASS__HTTP__REQUEST_TIMEOUT".into(), "600s".into()),
        ("HOURGLASS__HTTP__WRITE_TIMEOUT".into(), "590s".into()),
        // The figure is the latency, however long it is on the stand-in.
        ("HOURGLASS__QUERY__TIMEOUT".into(), "300s".into()),
    ]
}
