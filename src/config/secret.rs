//! Secrets in configuration: never printed by `Debug` or `Display`, and URLs redacted wherever
//! they appear in logs and errors (the password and any credential in the query string).

use std::fmt;

use serde::Deserialize;

/// A secret string (password, key): never printed by `Debug` or `Display`.
#[derive(Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_empty() { "\"\"" } else { "\"***\"" })
    }
}

/// Query parameters whose values are credentials (libpq's `password`, `sslpassword`, S3-style keys).
const SECRET_PARAMS: &[&str] =
    &["password", "passwd", "pass", "pwd", "sslpassword", "secret", "token", "access_key", "secret_key", "secret_access_key", "auth"];

/// A URL whose credentials are never printed.
#[derive(Clone, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct SecretUrl(String);

impl SecretUrl {
    pub fn new(s: impl Into<String>) -> Self {
        SecretUrl(s.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
    /// The URL with its password and credential query parameters replaced by `***`.
    pub fn redacted(&self) -> String {
        redact_url(&self.0)
    }
}

/// `url` with its password and credential query parameters replaced by `***`; a string that is
/// not a URL is not shown at all.
pub fn redact_url(url: &str) -> String {
    let Ok(mut u) = url::Url::parse(url) else { return "<unparseable url>".to_string() };
    if u.password().is_some() {
        let _ = u.set_password(Some("***"));
    }
    if u.query().is_some() {
        let pairs: Vec<(String, String)> = u
            .query_pairs()
            .map(|(k, v)| {
                let secret = SECRET_PARAMS.contains(&k.to_ascii_lowercase().as_str());
                (k.into_owned(), if secret { "***".to_string() } else { v.into_owned() })
            })
            .collect();
        u.query_pairs_mut().clear().extend_pairs(pairs);
    }
    u.to_string()
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.redacted())
    }
}

impl fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_in_the_authority_and_the_query_string_are_redacted() {
        let u = SecretUrl::new("postgres://u:hunter2@db/x?sslmode=require&password=Secret1&PASSWORD=Secret2");
        let r = u.redacted();
        assert!(!r.contains("hunter2") && !r.contains("Secret1") && !r.contains("Secret2"), "{r}");
        assert!(r.contains("sslmode=require"), "{r}");
        assert!(!format!("{u:?} {u}").contains("Secret"));
        assert_eq!(redact_url("not a url with a password"), "<unparseable url>");
    }
}
