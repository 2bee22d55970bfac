//! Query-string parameters: the ones a route names, plus `label.<name>`
//! filters; anything else, or a parameter twice, is a clear 400.

use super::ApiError;
use crate::domain::valid_label_name;

#[derive(Debug, Default)]
pub struct Params {
    pairs: Vec<(String, String)>,
    labels: Vec<(String, String)>,
}

impl Params {
    /// `allowed`: the route's parameter names; `labels`: whether it takes
    /// `label.<name>=<value>` filters.
    pub fn parse(raw: Option<&str>, allowed: &[&str], labels: bool) -> Result<Self, ApiError> {
        let mut out = Self::default();
        for (key, value) in url::form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
            if let Some(name) = key.strip_prefix("label.").filter(|_| labels) {
                if !valid_label_name(name) {
                    return Err(ApiError::bad_request(format!(
                        "label.{name}: {name:?} is not a label name (A-Z a-z 0-9 _, not starting with a digit or __)"
                    )));
                }
                if out.labels.iter().any(|(n, _)| n == name) {
                    return Err(ApiError::bad_request(format!(
                        "label.{name} is given twice"
                    )));
                }
                out.labels.push((name.to_owned(), value.into_owned()));
                continue;
            }
            if !allowed.contains(&key.as_ref()) {
                let mut names = allowed.join(", ");
                if labels {
                    names.push_str(", label.<name>");
                }
                return Err(ApiError::bad_request(format!(
                    "unknown parameter {key:?}; this route takes {names}"
                )));
            }
            if out.pairs.iter().any(|(k, _)| *k == key) {
                return Err(ApiError::bad_request(format!("{key} is given twice")));
            }
            out.pairs.push((key.into_owned(), value.into_owned()));
        }
        Ok(out)
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn require(&self, key: &str) -> Result<&str, ApiError> {
        self.get(key)
            .ok_or_else(|| ApiError::bad_request(format!("{key} is required")))
    }

    pub fn labels(&self) -> &[(String, String)] {
        &self.labels
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_parameters_and_label_filters_are_read() {
        let p = Params::parse(
            Some("from=1&label.site=Berlin%20Mitte&to=2"),
            &["from", "to"],
            true,
        )
        .expect("valid");
        assert_eq!(p.get("from"), Some("1"));
        assert_eq!(
            p.labels(),
            &[("site".to_owned(), "Berlin Mitte".to_owned())]
        );
    }

    #[test]
    fn unknown_repeated_and_malformed_parameters_are_refused() {
        for raw in [
            "form=1",
            "from=1&from=2",
            "label.site=a&label.site=b",
            "label.__name__=x",
            "label.a-b=x",
        ] {
            assert!(Params::parse(Some(raw), &["from"], true).is_err(), "{raw}");
        }
        assert!(Params::parse(Some("label.site=a"), &["from"], false).is_err());
    }
}
