//! Topic patterns with named captures: MQTT filters whose levels may also
//! be `{name}` (one level) or `{name#}` (one level or more, anywhere).

/// One level of a pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Level {
    Literal(String),
    /// `+`
    One,
    /// `#`, last only: any number of levels, none included.
    Any,
    /// `{name}`
    Capture(String),
    /// `{name#}`: one level or more, joined by `/`.
    Rest(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    levels: Vec<Level>,
}

impl Pattern {
    /// Parses `text`, naming the fault.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.is_empty() {
            return Err("is empty".to_owned());
        }
        let parts: Vec<&str> = text.split('/').collect();
        let mut levels = Vec::with_capacity(parts.len());
        for (i, part) in parts.iter().enumerate() {
            let level = match *part {
                "+" => Level::One,
                "#" if i + 1 == parts.len() => Level::Any,
                "#" => return Err("has `#` before its last level".to_owned()),
                p if p.starts_with('{') && p.ends_with('}') => {
                    let inner = &p[1..p.len() - 1];
                    let (name, rest) = match inner.strip_suffix('#') {
                        Some(name) => (name, true),
                        None => (inner, false),
                    };
                    if name.is_empty()
                        || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                    {
                        return Err(format!(
                            "has a capture {p:?} whose name is not [A-Za-z0-9_]+"
                        ));
                    }
                    if rest {
                        Level::Rest(name.to_owned())
                    } else {
                        Level::Capture(name.to_owned())
                    }
                }
                p if p.contains(['+', '#', '{', '}']) => {
                    return Err(format!("has a level {p:?} that mixes text and a wildcard"));
                }
                p => Level::Literal(p.to_owned()),
            };
            levels.push(level);
        }
        let rests = levels
            .iter()
            .filter(|l| matches!(l, Level::Rest(_)))
            .count();
        if rests > 1 {
            return Err("has more than one multi-level capture".to_owned());
        }
        let pattern = Self { levels };
        let mut names: Vec<&str> = pattern.captures().collect();
        names.sort_unstable();
        if names.windows(2).any(|w| w[0] == w[1]) {
            return Err("names a capture twice".to_owned());
        }
        Ok(pattern)
    }

    /// The capture names, in order.
    pub fn captures(&self) -> impl Iterator<Item = &str> {
        self.levels.iter().filter_map(|l| match l {
            Level::Capture(n) | Level::Rest(n) => Some(n.as_str()),
            _ => None,
        })
    }

    /// Whether the capture `name` takes several levels (`{name#}`).
    pub fn is_multi_level(&self, name: &str) -> bool {
        self.levels
            .iter()
            .any(|l| matches!(l, Level::Rest(n) if n == name))
    }

    /// The MQTT filter that subscribes to every topic it may match.
    pub fn filter(&self) -> String {
        let mut out = Vec::with_capacity(self.levels.len());
        for level in &self.levels {
            match level {
                Level::Literal(l) => out.push(l.as_str()),
                Level::One | Level::Capture(_) => out.push("+"),
                Level::Any | Level::Rest(_) => {
                    out.push("#");
                    break;
                }
            }
        }
        out.join("/")
    }

    /// Whether `topic` matches, its captures in `out` (name, text) if so.
    pub fn matches<'p, 't>(&'p self, topic: &'t str, out: &mut Vec<(&'p str, &'t str)>) -> bool {
        out.clear();
        // `$`-topics are the broker's own, as for MQTT's own wildcards.
        if topic.starts_with('$') && !matches!(self.levels.first(), Some(Level::Literal(_))) {
            return false;
        }
        let levels: Vec<(usize, &str)> = level_spans(topic);
        self.match_from(0, topic, &levels, 0, out)
    }

    fn match_from<'p, 't>(
        &'p self,
        at: usize,
        topic: &'t str,
        levels: &[(usize, &'t str)],
        from: usize,
        out: &mut Vec<(&'p str, &'t str)>,
    ) -> bool {
        let Some(level) = self.levels.get(at) else {
            return from == levels.len();
        };
        match level {
            Level::Any => true,
            Level::Rest(name) => {
                // Longest first: the literal levels after it are few.
                for end in (from + 1..=levels.len()).rev() {
                    let mark = out.len();
                    let start = levels[from].0;
                    let (last_start, last) = levels[end - 1];
                    out.push((name, &topic[start..last_start + last.len()]));
                    if self.match_from(at + 1, topic, levels, end, out) {
                        return true;
                    }
                    out.truncate(mark);
                }
                false
            }
            _ => {
                let Some(&(_, text)) = levels.get(from) else {
                    return false;
                };
                let ok = match level {
                    Level::Literal(l) => l == text,
                    Level::One => true,
                    Level::Capture(name) => {
                        if text.is_empty() {
                            return false;
                        }
                        out.push((name, text));
                        true
                    }
                    Level::Any | Level::Rest(_) => unreachable!("handled above"),
                };
                ok && self.match_from(at + 1, topic, levels, from + 1, out)
            }
        }
    }
}

/// Each level of `topic` with where it starts.
fn level_spans(topic: &str) -> Vec<(usize, &str)> {
    let mut at = 0;
    topic
        .split('/')
        .map(|l| {
            let span = (at, l);
            at += l.len() + 1;
            span
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(pattern: &str, topic: &str) -> Option<Vec<(String, String)>> {
        let p = Pattern::parse(pattern).expect("valid");
        let mut out = Vec::new();
        p.matches(topic, &mut out).then(|| {
            out.iter()
                .map(|(n, t)| ((*n).to_owned(), (*t).to_owned()))
                .collect()
        })
    }

    fn pair(n: &str, t: &str) -> (String, String) {
        (n.to_owned(), t.to_owned())
    }

    #[test]
    fn captures_take_one_level_or_several() {
        assert_eq!(
            caps("tele/{sensor}/SENSOR", "tele/plug1/SENSOR"),
            Some(vec![pair("sensor", "plug1")])
        );
        assert_eq!(caps("tele/{sensor}/SENSOR", "tele/a/b/SENSOR"), None);
        assert_eq!(
            caps("zigbee2mqtt/{sensor#}", "zigbee2mqtt/living_room/weather"),
            Some(vec![pair("sensor", "living_room/weather")])
        );
        assert_eq!(
            caps(
                "zigbee2mqtt/{d#}/availability",
                "zigbee2mqtt/a/b/availability"
            ),
            Some(vec![pair("d", "a/b")])
        );
        assert_eq!(
            caps("zigbee2mqtt/{d#}/availability", "zigbee2mqtt/availability"),
            None
        );
        assert_eq!(
            caps("{sensor}/status/{component}", "shelly-1/status/switch:0"),
            Some(vec![
                pair("sensor", "shelly-1"),
                pair("component", "switch:0")
            ])
        );
        assert_eq!(caps("a/+/#", "a/b"), Some(vec![]));
        assert_eq!(
            caps("z/{d#}/set/#", "z/a/b/set/x"),
            Some(vec![pair("d", "a/b")])
        );
        assert_eq!(caps("a/+/#", "a/b/c/d"), Some(vec![]));
        assert_eq!(caps("{x}/y", "$SYS/y"), None);
        assert_eq!(caps("a/{x}", "a/"), None, "an empty level captures nothing");
    }

    #[test]
    fn the_filter_subscribes_to_every_topic_a_pattern_matches() {
        let f = |p: &str| Pattern::parse(p).expect("valid").filter();
        assert_eq!(f("tele/{sensor}/SENSOR"), "tele/+/SENSOR");
        assert_eq!(f("zigbee2mqtt/{sensor#}"), "zigbee2mqtt/#");
        assert_eq!(f("v3/{app}/devices/{sensor}/up"), "v3/+/devices/+/up");
        assert_eq!(f("{d#}/x"), "#");
    }

    #[test]
    fn bad_patterns_are_named() {
        for bad in [
            "",
            "a/#/b",
            "a/{}/b",
            "a/{x y}",
            "a/b{x}",
            "{a}/{a}",
            "{a#}/{b#}",
            "a/x+",
        ] {
            assert!(Pattern::parse(bad).is_err(), "{bad}");
        }
    }
}
