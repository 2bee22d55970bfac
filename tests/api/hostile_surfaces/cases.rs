//! A hostile case: a request, its name, and whether a timeout (503) is
//! its right answer; and the helpers the surfaces' lists are built with.

pub enum Request {
    Get(String),
    Form(String, String),
    Post(String, &'static str, Vec<u8>),
    Put(String, &'static str, Vec<u8>),
    Delete(String),
    /// Headers announcing a body of this many bytes, then 64 KiB of it: the
    /// answer may come before the rest (and the connection close with it).
    Oversized(String, usize),
}

pub struct Case {
    pub name: String,
    pub request: Request,
    /// 503 with Retry-After (a timeout), not a 4xx.
    pub timeout: bool,
}

pub fn get(name: impl Into<String>, path: impl Into<String>) -> Case {
    Case {
        name: name.into(),
        request: Request::Get(path.into()),
        timeout: false,
    }
}

/// A form POST, as Grafana sends PromQL.
pub fn form(name: impl Into<String>, path: &str, pairs: &[(&str, &str)]) -> Case {
    let body = url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish();
    Case {
        name: name.into(),
        request: Request::Form(path.into(), body),
        timeout: false,
    }
}

pub fn post(
    name: impl Into<String>,
    path: &str,
    ct: &'static str,
    body: impl Into<Vec<u8>>,
) -> Case {
    Case {
        name: name.into(),
        request: Request::Post(path.into(), ct, body.into()),
        timeout: false,
    }
}

pub fn enc(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

pub fn nested(open: &str, inner: &str, close: &str, n: usize) -> String {
    format!("{}{inner}{}", open.repeat(n), close.repeat(n))
}
