//! The label values the counters of readings take: where readings come
//! from and why input was refused. Few and fixed, as labels must be.

/// Where readings come from.
#[derive(Debug, Clone, Copy)]
pub enum Source {
    Http,
    Mqtt,
}

impl Source {
    pub(super) fn label(self) -> &'static str {
        match self {
            Source::Http => "http",
            Source::Mqtt => "mqtt",
        }
    }
}

/// Why input was refused.
#[derive(Debug, Clone, Copy)]
pub enum Rejection {
    /// A reading broke a rule (name, value, time window, unknown field).
    Invalid,
    /// The body or payload is not usable JSON or number, or is empty.
    Malformed,
    /// Over a size or count limit.
    TooLarge,
    /// HTTP content type is not JSON.
    ContentType,
    /// An MQTT topic that does not name a sensor.
    Topic,
    /// At the memory bound.
    Overloaded,
    /// Shutting down.
    ShuttingDown,
    /// New series past `[cardinality]`'s bounds.
    NewSeries,
}

impl Rejection {
    pub(super) const ALL: [Rejection; 8] = [
        Rejection::Invalid,
        Rejection::Malformed,
        Rejection::TooLarge,
        Rejection::ContentType,
        Rejection::Topic,
        Rejection::Overloaded,
        Rejection::ShuttingDown,
        Rejection::NewSeries,
    ];

    pub(super) fn label(self) -> &'static str {
        match self {
            Rejection::Invalid => "invalid",
            Rejection::Malformed => "malformed",
            Rejection::TooLarge => "too_large",
            Rejection::ContentType => "content_type",
            Rejection::Topic => "topic",
            Rejection::Overloaded => "overloaded",
            Rejection::ShuttingDown => "shutting_down",
            Rejection::NewSeries => "new_series",
        }
    }
}
