//! A real Mosquitto per test (from config/mosquitto.conf) and a QoS 1 publisher.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use tokio::sync::mpsc;

use crate::helpers::{eventually, free_port, listening};

fn mosquitto_bin() -> String {
    std::env::var("MOSQUITTO").unwrap_or_else(|_| {
        for p in [
            "/usr/sbin/mosquitto",
            "/usr/bin/mosquitto",
            "/usr/local/sbin/mosquitto",
        ] {
            if Path::new(p).exists() {
                return p.to_owned();
            }
        }
        panic!("mosquitto is not installed; `make test` installs it from apt")
    })
}

pub struct Broker {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
    /// amqtt, which speaks MQTT 3.1.1 only, rather than Mosquitto.
    only_311: bool,
}

impl Broker {
    pub async fn start() -> Broker {
        let mut b = Broker {
            port: free_port(),
            dir: tempfile::tempdir().expect("a temp dir"),
            child: None,
            only_311: false,
        };
        b.launch().await;
        b
    }

    /// A broker that speaks MQTT 3.1.1 only (amqtt: `make test` installs
    /// it), refusing an MQTT 5 connect as such brokers do.
    pub async fn start_311() -> Broker {
        let mut b = Broker {
            port: free_port(),
            dir: tempfile::tempdir().expect("a temp dir"),
            child: None,
            only_311: true,
        };
        b.launch().await;
        b
    }

    pub fn url(&self) -> String {
        format!("mqtt://127.0.0.1:{}", self.port)
    }

    async fn launch(&mut self) {
        if self.only_311 {
            let amqtt = std::env::var("HOURGLASS_TEST_AMQTT")
                .expect("HOURGLASS_TEST_AMQTT: `make test` installs amqtt (scripts/stack.sh)");
            let path = self.dir.path().join("amqtt.yaml");
            let conf = format!(
                "listeners:\n  default:\n    type: tcp\n    bind: 127.0.0.1:{}\n",
                self.port
            );
            std::fs::write(&path, conf).expect("write the broker config");
            let child = Command::new(amqtt)
                .arg("-c")
                .arg(&path)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("amqtt starts");
            self.child = Some(child);
            listening(self.port, "amqtt listens").await;
            return;
        }
        let base = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/config/mosquitto.conf"
        ))
        .expect("config/mosquitto.conf");
        let user = std::env::var("USER").unwrap_or_else(|_| "root".into());
        let conf = format!(
            "{base}\nlistener {} 127.0.0.1\npersistence_location {}/\nuser {user}\n",
            self.port,
            self.dir.path().display()
        );
        let path = self.dir.path().join("mosquitto.conf");
        std::fs::write(&path, conf).expect("write the broker config");
        let child = Command::new(mosquitto_bin())
            .arg("-c")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("mosquitto starts");
        self.child = Some(child);
        listening(self.port, "mosquitto listens").await;
    }

    /// SIGTERM (Mosquitto saves its persistence file), then start again on the
    /// same port with the same data directory.
    pub async fn restart(&mut self) {
        self.terminate();
        self.launch().await;
    }

    /// Stops the broker (SIGTERM) without starting it again.
    pub fn terminate(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(child.id().to_string())
                .status();
            // Bounded, as the stand-in's stop (see `Database`).
            if crate::helpers::wait_at_most(&mut child, std::time::Duration::from_secs(60))
                .is_none()
            {
                eprintln!("Mosquitto did not stop within 60 s of SIGTERM; killing it.");
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Publishes at QoS 1 and counts the broker's PUBACKs.
pub struct Publisher {
    client: AsyncClient,
    acked: Arc<AtomicUsize>,
    sent: usize,
    received: Option<mpsc::UnboundedReceiver<(String, Vec<u8>)>>,
    done: Arc<AtomicBool>,
}

impl Publisher {
    pub async fn connect(broker: &Broker, id: &str) -> Publisher {
        Self::connect_subscribed(broker, id, None).await
    }

    /// Also subscribes to `topic` and collects what arrives there.
    pub async fn connect_subscribed(broker: &Broker, id: &str, topic: Option<&str>) -> Publisher {
        Self::connect_to(broker.port, id, topic).await
    }

    /// Connects to the broker on `port` (from a task that does not hold it).
    pub async fn connect_port(port: u16, id: &str) -> Publisher {
        Self::connect_to(port, id, None).await
    }

    async fn connect_to(port: u16, id: &str, topic: Option<&str>) -> Publisher {
        let mut options = MqttOptions::new(id, "127.0.0.1", port);
        options
            .set_keep_alive(Duration::from_secs(30))
            .set_max_packet_size(4 << 20, 4 << 20);
        let (client, mut eventloop) = AsyncClient::new(options, 1000);
        let acked = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::unbounded_channel();
        let subscribed = Arc::new(AtomicBool::new(topic.is_none()));
        if let Some(t) = topic {
            client
                .subscribe(t, QoS::AtLeastOnce)
                .await
                .expect("subscribe");
        }
        let (a, d, s) = (acked.clone(), done.clone(), subscribed.clone());
        tokio::spawn(async move {
            while !d.load(Ordering::Relaxed) {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::PubAck(_))) => {
                        a.fetch_add(1, Ordering::SeqCst);
                    }
                    Ok(Event::Incoming(Packet::SubAck(_))) => s.store(true, Ordering::SeqCst),
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        let _ = tx.send((p.topic.clone(), p.payload.to_vec()));
                    }
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        });
        eventually(
            Duration::from_secs(20),
            "the test client subscribed",
            || {
                let s = subscribed.clone();
                async move { s.load(Ordering::SeqCst) }
            },
        )
        .await;
        Publisher {
            client,
            acked,
            sent: 0,
            received: Some(rx),
            done,
        }
    }

    pub async fn publish(&mut self, topic: &str, payload: impl Into<Vec<u8>>) {
        self.publish_with(topic, payload, false).await;
    }

    /// Publishes a retained message: the broker keeps it for later subscribers.
    pub async fn publish_retained(&mut self, topic: &str, payload: impl Into<Vec<u8>>) {
        self.publish_with(topic, payload, true).await;
    }

    async fn publish_with(&mut self, topic: &str, payload: impl Into<Vec<u8>>, retain: bool) {
        self.client
            .publish(topic, QoS::AtLeastOnce, retain, payload.into())
            .await
            .expect("queue a publish");
        self.sent += 1;
    }

    /// Waits until the broker acknowledged everything published so far.
    pub async fn flushed(&self) {
        let (acked, sent) = (self.acked.clone(), self.sent);
        eventually(
            Duration::from_secs(60),
            "the broker acknowledged every publish",
            || {
                let acked = acked.clone();
                async move { acked.load(Ordering::SeqCst) >= sent }
            },
        )
        .await;
    }

    pub fn messages(&mut self) -> mpsc::UnboundedReceiver<(String, Vec<u8>)> {
        self.received.take().expect("taken once")
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
        let _ = self.client.try_disconnect();
    }
}
