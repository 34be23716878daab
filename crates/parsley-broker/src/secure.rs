//! The local broker's `SASL_SSL` listener ([`SecureListener`]) and its two SCRAM users, as
//! [`up`](crate::broker::up) records them in the state directory's `secure` file: the super user
//! `parsley` ([`secure_listener`]) and the least-privilege user `parsley-app`
//! ([`least_privilege_listener`]), which has no ACL when the broker starts. Re-exported by
//! [`broker`](crate::broker).
//!
//! Invariant: a listener is returned only for the broker recorded in the same state directory
//! (its bootstrap address and configuration name it); reading one never contacts the broker.

use std::fs;
use std::path::{Path, PathBuf};

use crate::broker::{BrokerError, SECURE_MECHANISM, state_dir, uses_external_cluster};

/// The secure listener's second SCRAM user, with no ACL at start.
pub const LEAST_PRIVILEGE_USER: &str = "parsley-app";

/// The local broker's `SASL_SSL` listener: SASL/SCRAM-SHA-512 over TLS, with the
/// credentials and the CA certificate made when the broker was started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecureListener {
    /// The listener's `host:port` (on 127.0.0.1).
    pub bootstrap: String,
    /// The SASL mechanism ([`SECURE_MECHANISM`]).
    pub mechanism: &'static str,
    /// The SCRAM user.
    pub username: String,
    /// The SCRAM user's password.
    pub password: String,
    /// The CA certificate (PEM) that signed the broker's certificate: `ssl.ca.location`.
    pub ca_pem: PathBuf,
    /// A CA certificate (PEM) made at the same time that did *not* sign the broker's
    /// certificate: a client that trusts only this one must fail the TLS handshake.
    pub untrusted_ca_pem: PathBuf,
}

impl SecureListener {
    /// The librdkafka properties that connect a client to this listener (with
    /// `bootstrap.servers` set to [`SecureListener::bootstrap`]): `security.protocol`,
    /// `sasl.mechanisms`, `sasl.username`, `sasl.password` and `ssl.ca.location`. Host name
    /// verification stays on (librdkafka's default `https`): the certificate is valid for
    /// `127.0.0.1` and `localhost`.
    pub fn client_properties(&self) -> Vec<(String, String)> {
        [
            ("security.protocol", "SASL_SSL".to_string()),
            ("sasl.mechanisms", self.mechanism.to_string()),
            ("sasl.username", self.username.clone()),
            ("sasl.password", self.password.clone()),
            (
                "ssl.ca.location",
                self.ca_pem.to_string_lossy().into_owned(),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// The same listener with a password the broker does not accept.
    pub fn with_wrong_password(&self) -> SecureListener {
        SecureListener {
            password: format!("not-{}", self.password),
            ..self.clone()
        }
    }

    /// The same listener trusting only [`SecureListener::untrusted_ca_pem`], which did not
    /// sign the broker's certificate.
    pub fn with_untrusted_ca(&self) -> SecureListener {
        SecureListener {
            ca_pem: self.untrusted_ca_pem.clone(),
            ..self.clone()
        }
    }

    /// The principal of this listener's user, as ACLs name it (`User:parsley`).
    pub fn principal(&self) -> String {
        format!("User:{}", self.username)
    }

    /// The record [`up`](crate::broker::up) writes to the state directory: this listener, and
    /// the credentials of the least-privilege user `least` (password `None`: a record without
    /// them).
    pub(crate) fn record(&self, plaintext: &str, least: Option<&str>) -> String {
        let least = least.map_or(String::new(), |password| {
            format!(
                "least_privilege_username={LEAST_PRIVILEGE_USER}\n\
                 least_privilege_password={password}\n"
            )
        });
        format!(
            "# Written by parsley-broker: the secure listener of the broker at {plaintext}.\n\
             plaintext={plaintext}\nbootstrap={}\nmechanism={}\nusername={}\npassword={}\n\
             {least}",
            self.bootstrap, self.mechanism, self.username, self.password
        )
    }

    /// Reads a record written by [`SecureListener::record`]; returns the listener with the
    /// credentials of `user` and the plaintext bootstrap address of the broker it belongs to.
    pub(crate) fn parse(
        record: &str,
        dir: &Path,
        user: User,
    ) -> Result<(SecureListener, String), String> {
        let field = |name: &str| {
            record
                .lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
                .map(|v| v.trim().to_string())
                .ok_or_else(|| format!("no `{name}=` line"))
        };
        let prefix = match user {
            User::Super => "",
            User::LeastPrivilege => "least_privilege_",
        };
        let mechanism = field("mechanism")?;
        if mechanism != SECURE_MECHANISM {
            return Err(format!("unknown mechanism {mechanism}"));
        }
        let tls = dir.join("tls");
        Ok((
            SecureListener {
                bootstrap: field("bootstrap")?,
                mechanism: SECURE_MECHANISM,
                username: field(&format!("{prefix}username"))?,
                password: field(&format!("{prefix}password"))?,
                ca_pem: tls.join("ca.pem"),
                untrusted_ca_pem: tls.join("untrusted-ca.pem"),
            },
            field("plaintext")?,
        ))
    }
}

/// Which of the secure listener's SCRAM users a [`SecureListener`] connects as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum User {
    /// `parsley`, a super user.
    Super,
    /// [`LEAST_PRIVILEGE_USER`], allowed only what ACLs allow.
    LeastPrivilege,
}

/// The secure listener of the local broker, as [`up`](crate::broker::up) recorded it, with its
/// super user's credentials (`User:parsley`, allowed everything).
///
/// `Ok(None)` when `$PARSLEY_BOOTSTRAP` points at another cluster ([`uses_external_cluster`]:
/// its security is not this module's to know), or when the recorded broker has no secure
/// listener (one started by a version of this module without it: restart it with
/// `cargo kafka down` and `up`). Like [`bootstrap`](crate::broker::bootstrap), this reads the
/// state directory and does not contact the broker.
///
/// # Errors
/// [`BrokerError::NoBroker`] when no local broker is recorded; [`BrokerError::BadRecord`] when
/// the record cannot be read.
pub fn secure_listener() -> Result<Option<SecureListener>, BrokerError> {
    if uses_external_cluster() {
        return Ok(None);
    }
    recorded_secure_listener(&state_dir(), User::Super)
}

/// The secure listener of the local broker with the credentials of its least-privilege user
/// ([`LEAST_PRIVILEGE_USER`]): a principal (`User:parsley-app`) with no ACL when the broker
/// starts, so that every request it makes is refused (`TOPIC_AUTHORIZATION_FAILED`,
/// `GROUP_AUTHORIZATION_FAILED`, …) until an ACL allows it. A client of the `PLAINTEXT`
/// listener, a super user, grants them.
///
/// `Ok(None)` as for [`secure_listener`], and for a broker started by a version of this module
/// without the user (restart it with `cargo kafka down` and `up`).
///
/// # Errors
/// As [`secure_listener`].
pub fn least_privilege_listener() -> Result<Option<SecureListener>, BrokerError> {
    if uses_external_cluster() {
        return Ok(None);
    }
    let dir = state_dir();
    let record = fs::read_to_string(dir.join("secure")).unwrap_or_default();
    if !record.contains("least_privilege_username=") {
        // A record without the user (or none): the broker recorded has no such user.
        return recorded_secure_listener(&dir, User::Super).map(|_| None);
    }
    recorded_secure_listener(&dir, User::LeastPrivilege)
}

/// The secure listener recorded in the state directory `dir`, with the credentials of `user`,
/// if it belongs to the broker recorded there.
pub(crate) fn recorded_secure_listener(
    dir: &Path,
    user: User,
) -> Result<Option<SecureListener>, BrokerError> {
    let plaintext = fs::read_to_string(dir.join("bootstrap"))
        .map(|s| s.trim().to_string())
        .map_err(|_| BrokerError::NoBroker)?;
    let path = dir.join("secure");
    let record = match fs::read_to_string(&path) {
        Ok(record) => record,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(BrokerError::Io { path, source }),
    };
    let (listener, recorded_for) = SecureListener::parse(&record, dir, user)
        .map_err(|reason| BrokerError::BadRecord { path, reason })?;
    // The record belongs to the recorded broker only if that broker's configuration has the
    // listener: a broker started by an older version of this module, after this record was
    // written, has neither this bootstrap address nor the listener in its configuration.
    let props = fs::read_to_string(dir.join("server.properties")).unwrap_or_default();
    let configured = props.lines().any(|l| {
        l.strip_prefix("listeners=").is_some_and(|v| {
            v.split(',')
                .any(|e| e == format!("SASL_SSL://{}", listener.bootstrap))
        })
    });
    Ok((recorded_for == plaintext && configured).then_some(listener))
}
