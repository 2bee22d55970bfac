//! MQTT 5 or 3.1.1, the same to the rest of the ingestor: the client handle,
//! the connection and what it reports. rumqttc has a module per version,
//! each with types of its own; this is the one file that knows both.
//!
//! A received message is handed on as rumqttc's 3.1.1 `Publish` (topic,
//! payload, QoS, packet id, retain), which is all the ingestor reads of it.

use rumqttc::v5;
use rumqttc::v5::mqttbytes::QoS as QoS5;
use rumqttc::v5::mqttbytes::v5 as packets5;
use rumqttc::{Publish, QoS};

use super::error::MqttError;
use super::settings::{PACKET_OVERHEAD, Settings};

/// Session Expiry Interval: the session outlives any disconnection, as a
/// 3.1.1 session without a clean start does.
const SESSION_NEVER_EXPIRES: u32 = u32::MAX;

/// The version a connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Version {
    V5,
    V311,
}

impl Version {
    pub(super) fn label(self) -> &'static str {
        match self {
            Version::V5 => "5",
            Version::V311 => "3.1.1",
        }
    }
}

/// What a failed attempt says of the broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// It answered in MQTT 5 (a refused login, say).
    SpeaksV5,
    /// It refused MQTT 5, or answered in 3.1.1's form.
    Speaks311,
    /// It took the connection and gave no answer.
    Unanswered,
    /// It could not be reached.
    Unreachable,
}

/// A request rumqttc could not queue (full, or its event loop gone).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(super) struct NotQueued(String);

/// The handle that queues requests on a connection.
#[derive(Clone)]
pub(super) enum Client {
    V311(rumqttc::AsyncClient),
    V5(v5::AsyncClient),
}

fn qos5(q: QoS) -> QoS5 {
    match q {
        QoS::AtMostOnce => QoS5::AtMostOnce,
        QoS::AtLeastOnce => QoS5::AtLeastOnce,
        QoS::ExactlyOnce => QoS5::ExactlyOnce,
    }
}

fn qos311(q: QoS5) -> QoS {
    match q {
        QoS5::AtMostOnce => QoS::AtMostOnce,
        QoS5::AtLeastOnce => QoS::AtLeastOnce,
        QoS5::ExactlyOnce => QoS::ExactlyOnce,
    }
}

fn not_queued(e: impl std::fmt::Display) -> NotQueued {
    NotQueued(e.to_string())
}

impl Client {
    /// The PUBACK of QoS 1 message `pkid`.
    pub(super) fn try_ack(&self, pkid: u16) -> Result<(), NotQueued> {
        match self {
            Client::V311(c) => {
                let mut ack = Publish::new("", QoS::AtLeastOnce, Vec::new());
                ack.pkid = pkid;
                c.try_ack(&ack).map_err(not_queued)
            }
            Client::V5(c) => {
                let mut ack = packets5::Publish::new("", QoS5::AtLeastOnce, Vec::new(), None);
                ack.pkid = pkid;
                c.try_ack(&ack).map_err(not_queued)
            }
        }
    }

    /// Subscribes to `filters` at QoS 1.
    pub(super) fn try_subscribe(&self, filters: &[String]) -> Result<(), NotQueued> {
        match self {
            Client::V311(c) => c
                .try_subscribe_many(
                    filters
                        .iter()
                        .map(|t| rumqttc::SubscribeFilter::new(t.clone(), QoS::AtLeastOnce)),
                )
                .map_err(not_queued),
            Client::V5(c) => c
                .try_subscribe_many(
                    filters
                        .iter()
                        .map(|t| packets5::Filter::new(t.clone(), QoS5::AtLeastOnce)),
                )
                .map_err(not_queued),
        }
    }

    pub(super) fn try_publish(
        &self,
        topic: String,
        qos: QoS,
        retain: bool,
        payload: Vec<u8>,
    ) -> Result<(), NotQueued> {
        match self {
            Client::V311(c) => c
                .try_publish(topic, qos, retain, payload)
                .map_err(not_queued),
            Client::V5(c) => c
                .try_publish(topic, qos5(qos), retain, payload)
                .map_err(not_queued),
        }
    }

    pub(super) fn try_disconnect(&self) -> Result<(), NotQueued> {
        match self {
            Client::V311(c) => c.try_disconnect().map_err(not_queued),
            Client::V5(c) => c.try_disconnect().map_err(not_queued),
        }
    }
}

/// What a connection reports.
#[derive(Debug)]
pub(super) enum Incoming {
    ConnAck {
        accepted: bool,
        session_present: bool,
        /// The broker's return (3.1.1) or reason (5) code.
        code: String,
    },
    Publish(Publish),
    SubAck {
        refused: bool,
        codes: String,
    },
    /// The broker closed the connection, saying why (MQTT 5 only).
    Disconnect {
        reason: String,
    },
    Other,
}

/// Why a connection failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum ConnError {
    #[error(transparent)]
    V311(rumqttc::ConnectionError),
    #[error(transparent)]
    V5(v5::ConnectionError),
    /// The broker broke the protocol in a way rumqttc lets through.
    #[error("the broker broke the protocol: {0}")]
    Violation(&'static str),
}

impl ConnError {
    /// The size of an incoming packet the connection failed on for being
    /// over its limit (3.1.1: see the connection's raised limit).
    pub(super) fn oversized(&self) -> Option<usize> {
        match self {
            ConnError::V311(rumqttc::ConnectionError::MqttState(
                rumqttc::StateError::Deserialization(
                    rumqttc::mqttbytes::Error::PayloadSizeLimitExceeded(size),
                ),
            )) => Some(*size),
            _ => None,
        }
    }

    /// What an MQTT 5 attempt's answer says of the broker, when it
    /// answered (a CONNACK refusing it).
    pub(super) fn answered(&self) -> Option<Verdict> {
        use v5::mqttbytes::v5::ConnectReturnCode as Code;
        match self {
            ConnError::V5(v5::ConnectionError::ConnectionRefused(
                Code::UnsupportedProtocolVersion | Code::RefusedProtocolVersion,
            )) => Some(Verdict::Speaks311),
            ConnError::V5(v5::ConnectionError::ConnectionRefused(_)) => Some(Verdict::SpeaksV5),
            _ => None,
        }
    }

    /// Whether the broker could not be reached at all.
    pub(super) fn unreachable(&self) -> bool {
        use std::io::ErrorKind;
        let io = match self {
            ConnError::V5(v5::ConnectionError::Io(io)) => io,
            ConnError::V311(rumqttc::ConnectionError::Io(io)) => io,
            _ => return false,
        };
        matches!(
            io.kind(),
            ErrorKind::ConnectionRefused
                | ErrorKind::NotFound
                | ErrorKind::HostUnreachable
                | ErrorKind::NetworkUnreachable
                | ErrorKind::AddrNotAvailable
        )
    }
}

/// A connection's event loop.
pub(super) enum Connection {
    V311(Box<rumqttc::EventLoop>),
    V5(Box<v5::EventLoop>),
}

impl Connection {
    pub(super) fn version(&self) -> Version {
        match self {
            Connection::V311(_) => Version::V311,
            Connection::V5(_) => Version::V5,
        }
    }

    /// The next event: connects (again) when there is no connection.
    pub(super) async fn poll(&mut self) -> Result<Incoming, ConnError> {
        match self {
            Connection::V311(el) => {
                use rumqttc::{ConnectReturnCode, Event, Packet, SubscribeReasonCode};
                Ok(match el.poll().await.map_err(ConnError::V311)? {
                    Event::Incoming(Packet::ConnAck(ack)) => Incoming::ConnAck {
                        accepted: ack.code == ConnectReturnCode::Success,
                        session_present: ack.session_present,
                        code: format!("{:?}", ack.code),
                    },
                    Event::Incoming(Packet::Publish(p)) => Incoming::Publish(p),
                    Event::Incoming(Packet::SubAck(ack)) => Incoming::SubAck {
                        refused: ack
                            .return_codes
                            .iter()
                            .any(|c| matches!(c, SubscribeReasonCode::Failure)),
                        codes: format!("{:?}", ack.return_codes),
                    },
                    _ => Incoming::Other,
                })
            }
            Connection::V5(el) => {
                use v5::mqttbytes::v5::{ConnectReturnCode, Packet, SubscribeReasonCode};
                Ok(match el.poll().await.map_err(ConnError::V5)? {
                    v5::Event::Incoming(Packet::ConnAck(ack)) => Incoming::ConnAck {
                        accepted: ack.code == ConnectReturnCode::Success,
                        session_present: ack.session_present,
                        code: format!("{:?}", ack.code),
                    },
                    // rumqttc keeps every alias a broker sets, holding its
                    // packet's buffer, for the connection's life; this
                    // client allows none (Topic Alias Maximum 0).
                    v5::Event::Incoming(Packet::Publish(p))
                        if p.properties
                            .as_ref()
                            .is_some_and(|pr| pr.topic_alias.is_some()) =>
                    {
                        return Err(ConnError::Violation(
                            "a topic alias, which this client does not allow",
                        ));
                    }
                    v5::Event::Incoming(Packet::Publish(p)) => Incoming::Publish(Publish {
                        dup: p.dup,
                        qos: qos311(p.qos),
                        retain: p.retain,
                        // A topic that is not UTF-8 is a protocol error the
                        // broker lets through; it matches no route and is
                        // dead-lettered as a topic of no form.
                        topic: String::from_utf8_lossy(&p.topic).into_owned(),
                        pkid: p.pkid,
                        payload: p.payload,
                    }),
                    v5::Event::Incoming(Packet::SubAck(ack)) => Incoming::SubAck {
                        refused: ack
                            .return_codes
                            .iter()
                            .any(|c| !matches!(c, SubscribeReasonCode::Success(_))),
                        codes: format!("{:?}", ack.return_codes),
                    },
                    v5::Event::Incoming(Packet::Disconnect(d)) => Incoming::Disconnect {
                        reason: match d.properties.and_then(|p| p.reason_string) {
                            Some(text) => format!("{:?}: {text}", d.reason_code),
                            None => format!("{:?}", d.reason_code),
                        },
                    },
                    _ => Incoming::Other,
                })
            }
        }
    }
}

fn read(what: &'static str, path: &std::path::Path) -> Result<Vec<u8>, MqttError> {
    std::fs::read(path).map_err(|source| MqttError::File {
        what,
        path: path.to_owned(),
        source,
    })
}

/// The TLS transport `settings` ask for, if any.
fn transport(settings: &Settings) -> Result<Option<rumqttc::Transport>, MqttError> {
    if !settings.uses_tls() {
        return Ok(None);
    }
    crate::runtime::install_crypto_provider();
    let tls = &settings.tls;
    let ca = match &tls.ca_file {
        Some(path) => read("mqtt.tls.ca_file", path)?,
        None => Vec::new(),
    };
    let client_auth = match (&tls.client_cert_file, &tls.client_key_file) {
        (Some(cert), Some(key)) => Some((
            read("mqtt.tls.client_cert_file", cert)?,
            read("mqtt.tls.client_key_file", key)?,
        )),
        _ => None,
    };
    Ok(Some(rumqttc::Transport::tls(ca, client_auth, None)))
}

fn password(settings: &Settings) -> String {
    use secrecy::ExposeSecret;
    settings
        .password
        .as_ref()
        .map(|p| p.expose_secret().to_owned())
        .unwrap_or_default()
}

/// 3.1.1 client options for `settings`: persistent session, manual acks,
/// TLS and credentials as configured, and `will` (topic, payload) as a
/// retained QoS 1 Will.
pub(super) fn options_311(
    settings: &Settings,
    will: Option<(String, Vec<u8>)>,
    request_capacity: usize,
    incoming_limit: usize,
) -> Result<rumqttc::MqttOptions, MqttError> {
    let (host, port) = settings.host_port()?;
    let mut options = rumqttc::MqttOptions::new(settings.client_id.clone(), host, port);
    let limit = settings.max_payload_bytes + PACKET_OVERHEAD;
    options
        .set_keep_alive(settings.keep_alive)
        .set_clean_session(false)
        .set_manual_acks(true)
        .set_max_packet_size(incoming_limit.max(limit), limit)
        .set_request_channel_capacity(request_capacity);
    if let Some((topic, payload)) = will {
        options.set_last_will(rumqttc::LastWill::new(
            topic,
            payload,
            QoS::AtLeastOnce,
            true,
        ));
    }
    if let Some(user) = &settings.username {
        options.set_credentials(user.clone(), password(settings));
    }
    if let Some(t) = transport(settings)? {
        options.set_transport(t);
    }
    Ok(options)
}

/// MQTT 5 client options: as [`options_311`], with a session that never
/// expires, the broker's flow control (Receive Maximum) at
/// `mqtt.max_unacked`, and the packet limit told to the broker (which
/// drops a message over it): rumqttc's MQTT 5 parser makes many times a
/// packet's size of its properties, so this bounds what a publisher can
/// make the process hold.
pub(super) fn options_5(
    settings: &Settings,
    will: Option<(String, Vec<u8>)>,
    request_capacity: usize,
) -> Result<v5::MqttOptions, MqttError> {
    let (host, port) = settings.host_port()?;
    let mut options = v5::MqttOptions::new(settings.client_id.clone(), host, port);
    let receive_maximum = u16::try_from(settings.max_unacked.clamp(1, 65_535)).unwrap_or(u16::MAX);
    options
        .set_keep_alive(settings.keep_alive)
        .set_clean_start(false)
        .set_session_expiry_interval(Some(SESSION_NEVER_EXPIRES))
        .set_manual_acks(true)
        .set_receive_maximum(Some(receive_maximum))
        .set_max_packet_size(Some(
            u32::try_from(settings.max_payload_bytes + PACKET_OVERHEAD).unwrap_or(u32::MAX),
        ))
        .set_request_channel_capacity(request_capacity);
    if let Some((topic, payload)) = will {
        options.set_last_will(packets5::LastWill::new(
            topic,
            payload,
            QoS5::AtLeastOnce,
            true,
            None,
        ));
    }
    if let Some(user) = &settings.username {
        options.set_credentials(user.clone(), password(settings));
    }
    if let Some(t) = transport(settings)? {
        options.set_transport(t);
    }
    Ok(options)
}

/// A client and its connection speaking `version`.
/// `incoming_limit` raises a 3.1.1 connection's packet limit (to take an
/// oversized message once).
pub(super) fn open(
    settings: &Settings,
    will: Option<(String, Vec<u8>)>,
    request_capacity: usize,
    version: Version,
    incoming_limit: usize,
) -> Result<(Client, Connection), MqttError> {
    Ok(match version {
        Version::V311 => {
            let (c, el) = rumqttc::AsyncClient::new(
                options_311(settings, will, request_capacity, incoming_limit)?,
                request_capacity,
            );
            (Client::V311(c), Connection::V311(Box::new(el)))
        }
        Version::V5 => {
            let (c, el) = v5::AsyncClient::new(
                options_5(settings, will, request_capacity)?,
                request_capacity,
            );
            (Client::V5(c), Connection::V5(Box::new(el)))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_carry_the_session_tls_and_credentials() {
        let dir = tempfile::tempdir().expect("temp dir");
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, b"ca-bytes").expect("write");
        let mut s = Settings {
            url: "mqtt://broker:1883".into(),
            ..Settings::default()
        };
        let o = options_311(&s, None, 10, 0).expect("options");
        assert!(!o.clean_session() && o.manual_acks());
        assert!(matches!(o.transport(), rumqttc::Transport::Tcp));
        let o = options_5(&s, None, 10).expect("options");
        assert!(!o.clean_start() && o.manual_acks());
        assert_eq!(
            o.session_expiry_interval(),
            Some(u32::MAX),
            "a kept session"
        );
        assert_eq!(o.receive_maximum(), Some(s.max_unacked as u16));
        s.url = "mqtts://broker:8883".into();
        s.tls.ca_file = Some(ca.clone());
        s.username = Some("hg".into());
        s.password = Some("pw".into());
        let o = options_311(&s, None, 10, 0).expect("options");
        assert!(matches!(o.transport(), rumqttc::Transport::Tls(_)));
        let login = o.credentials().expect("credentials");
        assert_eq!(
            (login.username.as_str(), login.password.as_str()),
            ("hg", "pw")
        );
        let o = options_5(&s, None, 10).expect("options");
        assert!(matches!(o.transport(), rumqttc::Transport::Tls(_)));
        assert!(o.credentials().is_some());
        s.tls.ca_file = Some(dir.path().join("missing.pem"));
        let err = options_311(&s, None, 10, 0)
            .expect_err("missing CA")
            .to_string();
        assert!(err.contains("mqtt.tls.ca_file"), "{err}");
    }

    #[test]
    fn the_protocol_setting_reads_text_or_the_number_an_environment_variable_becomes() {
        use super::super::settings::Protocol;
        let read = |json: &str| serde_json::from_str::<Protocol>(json);
        assert_eq!(read("\"auto\"").ok(), Some(Protocol::Auto));
        assert_eq!(read("\"5\"").ok(), Some(Protocol::V5));
        assert_eq!(read("5").ok(), Some(Protocol::V5));
        assert_eq!(read("\"3.1.1\"").ok(), Some(Protocol::V311));
        for bad in ["\"4\"", "3.1", "\"v5\"", "null"] {
            let e = read(bad).expect_err(bad).to_string();
            assert!(e.contains("\"auto\", \"5\" or \"3.1.1\""), "{e}");
        }
    }

    #[test]
    fn a_refusal_in_mqtt_5_says_which_version_and_a_dial_failure_none() {
        use std::io::{Error, ErrorKind};
        use v5::ConnectionError as E;
        use v5::mqttbytes::v5::ConnectReturnCode as Code;
        let v5 = |e| ConnError::V5(e);
        assert_eq!(
            v5(E::ConnectionRefused(Code::UnsupportedProtocolVersion)).answered(),
            Some(Verdict::Speaks311)
        );
        assert_eq!(
            v5(E::ConnectionRefused(Code::NotAuthorized)).answered(),
            Some(Verdict::SpeaksV5)
        );
        // Closed, reset, aborted: no answer at all.
        assert_eq!(
            v5(E::MqttState(v5::StateError::ConnectionAborted)).answered(),
            None
        );
        assert_eq!(
            v5(E::Io(Error::from(ErrorKind::UnexpectedEof))).answered(),
            None
        );
        assert!(v5(E::Io(Error::from(ErrorKind::ConnectionRefused))).unreachable());
        assert!(!v5(E::Io(Error::from(ErrorKind::ConnectionReset))).unreachable());
    }
}
