//! The tokens in force. A reload (SIGHUP, or `auth.tokens_file` changing)
//! builds a whole new set and swaps it in: a request is checked against the
//! set in force when it arrived, and a token removed is refused from the
//! next request on. A set that does not check out is not applied.

use std::sync::{Arc, RwLock};

use super::tokens::{AuthConfigError, Authenticator, Settings};

/// The set of tokens in force, replaced whole by [`Keyring::reload`].
pub struct Keyring {
    current: RwLock<Arc<Authenticator>>,
}

impl Keyring {
    pub fn new(first: Authenticator) -> Self {
        Self {
            current: RwLock::new(Arc::new(first)),
        }
    }

    /// The set in force now.
    pub fn current(&self) -> Arc<Authenticator> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Whether authentication is on (fixed at start).
    pub fn enabled(&self) -> bool {
        self.current().enabled()
    }

    /// Puts the tokens of `settings` in force (`auth.tokens`, and the
    /// tokens file's `text` as read), returning how many; a fault leaves
    /// the set in force as it was.
    pub fn reload(
        &self,
        settings: &Settings,
        text: Option<&str>,
    ) -> Result<usize, AuthConfigError> {
        if settings.enabled != self.enabled() {
            return Err(AuthConfigError::EnabledChanged);
        }
        let next = Arc::new(settings.build_with(text)?);
        let count = next.tokens();
        let before = std::mem::replace(
            &mut *self.current.write().unwrap_or_else(|e| e.into_inner()),
            next,
        );
        // Freed after the lock, not under it.
        drop(before);
        Ok(count)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::auth::tokens::{MAX_FILE_BYTES, Scope, TokenSettings, hash_token, read_tokens_file};

    fn file_with(dir: &Path, tokens: &[(&str, &str)]) -> std::path::PathBuf {
        let path = dir.join("tokens.toml");
        let text: String = tokens
            .iter()
            .map(|(name, token)| {
                format!(
                    "[[tokens]]\nname = {name:?}\nsha256 = {:?}\nscopes = [\"query\"]\n",
                    hash_token(token)
                )
            })
            .collect();
        std::fs::write(&path, text).expect("written");
        path
    }

    fn settings(file: &Path) -> Settings {
        Settings {
            enabled: true,
            tokens: Vec::new(),
            tokens_file: Some(file.to_owned()),
        }
    }

    fn reload(keyring: &Keyring, settings: &Settings) -> Result<usize, AuthConfigError> {
        let text = settings
            .tokens_file
            .as_ref()
            .and_then(|p| crate::auth::tokens::read_bounded(p).ok());
        keyring.reload(settings, text.as_deref())
    }

    fn admits(keyring: &Keyring, token: &str) -> bool {
        keyring
            .current()
            .authenticate_token(Some(token), Scope::Query)
            .is_ok()
    }

    #[test]
    fn a_reload_puts_the_new_tokens_in_force_and_refuses_the_old_at_once() {
        let dir = tempfile::tempdir().expect("a directory");
        let file = file_with(dir.path(), &[("a", "old-secret")]);
        let keyring = Keyring::new(settings(&file).build().expect("valid"));
        assert!(admits(&keyring, "old-secret"));
        file_with(dir.path(), &[("b", "new-secret")]);
        assert_eq!(reload(&keyring, &settings(&file)), Ok(1));
        assert!(!admits(&keyring, "old-secret"));
        assert!(admits(&keyring, "new-secret"));
    }

    #[test]
    fn a_faulty_file_is_not_applied_and_names_the_file_and_the_token() {
        let dir = tempfile::tempdir().expect("a directory");
        let file = file_with(dir.path(), &[("a", "secret")]);
        let keyring = Keyring::new(settings(&file).build().expect("valid"));
        std::fs::write(
            &file,
            "[[tokens]]\nname = \"a\"\nsha256 = \"nothex\"\nscopes = [\"query\"]\n",
        )
        .expect("written");
        let fault = reload(&keyring, &settings(&file)).expect_err("refused");
        let text = fault.to_string();
        assert!(
            text.contains("tokens.toml") && text.contains("tokens[0].sha256"),
            "{text}"
        );
        assert!(admits(&keyring, "secret"), "the set in force stays");
        std::fs::write(&file, "[[tokens]]\nbogus = 1\n").expect("written");
        assert!(reload(&keyring, &settings(&file)).is_err());
        std::fs::remove_file(&file).expect("removed");
        assert!(reload(&keyring, &settings(&file)).is_err());
        assert!(admits(&keyring, "secret"));
    }

    #[test]
    fn a_reload_cannot_turn_authentication_off() {
        let dir = tempfile::tempdir().expect("a directory");
        let file = file_with(dir.path(), &[("a", "secret")]);
        let keyring = Keyring::new(settings(&file).build().expect("valid"));
        let mut off = settings(&file);
        off.enabled = false;
        assert_eq!(reload(&keyring, &off), Err(AuthConfigError::EnabledChanged));
        assert!(keyring.enabled());
    }

    #[test]
    fn a_name_in_both_the_configuration_and_the_file_is_refused() {
        let dir = tempfile::tempdir().expect("a directory");
        let file = file_with(dir.path(), &[("a", "secret")]);
        let mut both = settings(&file);
        both.tokens = vec![TokenSettings {
            name: "a".into(),
            sha256: hash_token("other"),
            scopes: vec![Scope::Query],
            sensors: None,
        }];
        let fault = both.build().err().expect("refused").to_string();
        assert!(fault.contains("tokens[0].name"), "{fault}");
    }

    #[test]
    fn one_token_under_two_names_is_refused() {
        let dir = tempfile::tempdir().expect("a directory");
        let file = file_with(dir.path(), &[("a", "secret"), ("b", "secret")]);
        let fault = settings(&file).build().err().expect("refused").to_string();
        assert!(
            fault.contains("tokens[1]") && fault.contains("same token"),
            "{fault}"
        );
    }

    #[test]
    fn only_a_regular_file_is_read() {
        let dir = tempfile::tempdir().expect("a directory");
        assert!(crate::auth::tokens::read_bounded(dir.path()).is_err());
    }

    #[test]
    fn a_file_over_the_bound_is_refused() {
        let dir = tempfile::tempdir().expect("a directory");
        let path = dir.path().join("big.toml");
        std::fs::write(&path, vec![b'#'; MAX_FILE_BYTES as usize + 1]).expect("written");
        assert!(read_tokens_file(&path).is_err());
    }
}
