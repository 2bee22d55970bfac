//! A private SecantusDB for tests that stop and restart the storage server.

use std::process::{Child, Command, Stdio};

use std::time::Duration;

use crate::helpers::{free_port, listening, wait_at_most};

fn secantusd() -> String {
    std::env::var("SECANTUSD").unwrap_or_else(|_| {
        let local = concat!(env!("CARGO_MANIFEST_DIR"), "/.venv/bin/secantusd-py");
        assert!(
            std::path::Path::new(local).exists(),
            "SECANTUSD is not set and {local} is missing; `make test` installs it"
        );
        local.to_owned()
    })
}

pub struct Database {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Database {
    pub async fn start() -> Database {
        let mut db = Database {
            port: free_port(),
            dir: tempfile::tempdir().expect("a temp dir"),
            child: None,
        };
        db.launch().await;
        db
    }

    /// Test settings with this server as storage.
    pub fn settings(&self) -> hourglass::Settings {
        let mut s = crate::helpers::test_settings();
        s.mongodb.uri = self.uri().into();
        s
    }

    pub fn uri(&self) -> String {
        format!(
            "mongodb://127.0.0.1:{}/?directConnection=true&serverSelectionTimeoutMS=1000",
            self.port
        )
    }

    async fn launch(&mut self) {
        let child = Command::new(secantusd())
            .args([
                "--host",
                "127.0.0.1",
                "--port",
                &self.port.to_string(),
                "--log-level",
                "ERROR",
                // configureFailPoint, as mongod's enableTestCommands.
                "--enable-test-commands",
            ])
            .arg("--storage-path")
            .arg(self.dir.path().join("data"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("secantusd-py starts");
        self.child = Some(child);
        listening(self.port, "the database listens").await;
        // Listening is not answering: on a loaded machine the stand-in takes
        // seconds to serve its first command, longer than the settings'
        // one-second server selection.
        let uri = format!("mongodb://127.0.0.1:{}/?directConnection=true", self.port);
        let client = mongodb::Client::with_uri_str(&uri)
            .await
            .expect("a MongoDB client");
        crate::helpers::eventually(Duration::from_secs(60), "the database answers", || async {
            client
                .database("admin")
                .run_command(mongodb::bson::doc! { "ping": 1 })
                .await
                .is_ok()
        })
        .await;
    }

    /// SIGTERM: the server shuts down cleanly, keeping what it acknowledged
    /// (a SIGKILL would test the stand-in's durability, not ours).
    pub fn stop_gracefully(&mut self) {
        if let Some(mut child) = self.child.take() {
            sigterm_main_thread(child.id());
            // Bounded: a stand-in whose stop hangs would hold the test
            // until CI's limit. Killed, it may lose what it had not synced,
            // which a test then reports.
            if wait_at_most(&mut child, Duration::from_secs(60)).is_none() {
                eprintln!(
                    "The stand-in on port {} did not stop within 60 s of SIGTERM; killing it.",
                    self.port
                );
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }

    pub async fn restart_gracefully(&mut self) {
        self.stop_gracefully();
        self.launch().await;
    }

    /// Sets the `failCommand` fail point (mode and data).
    pub async fn fail_point(&self, mut spec: mongodb::bson::Document) {
        spec.insert("configureFailPoint", "failCommand");
        let mut ordered = mongodb::bson::doc! { "configureFailPoint": "failCommand" };
        ordered.extend(spec);
        mongodb::Client::with_uri_str(self.uri())
            .await
            .expect("a client")
            .database("admin")
            .run_command(ordered)
            .await
            .expect("the server takes the fail point");
    }

    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub async fn restart(&mut self) {
        self.stop();
        self.launch().await;
    }
}

/// SIGTERM to the stand-in's main thread rather than to the process.
/// Python runs signal handlers only on its main thread, which SecantusDB
/// parks in an `Event.wait()` without timeout: a process-directed SIGTERM
/// that the kernel hands to one of its connection threads sets the
/// handler's flag and wakes nobody, and the server never stops (seen in
/// CI: a test held 84 minutes in `wait`; a thread-directed SIGTERM then
/// stopped that server at once).
fn sigterm_main_thread(pid: u32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: tgkill takes plain integers and touches no memory of ours;
    // the main thread's id is the process id.
    unsafe {
        libc::syscall(libc::SYS_tgkill, pid, pid, libc::SIGTERM);
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        self.stop();
    }
}
