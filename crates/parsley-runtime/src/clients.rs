//! The configuration of every Kafka client Parsley creates, built in one place.
//!
//! A stage creates four kinds of client ([`ClientRole`]): the consumer of its sources, its
//! transactional producer, an admin client, and, when a task is assigned, a consumer that
//! reads the task's changelog partition. A [`CausalProducer`](crate::CausalProducer) creates a
//! producer and an admin client. Every one of them is configured by
//! [`ClientSettings::config`], in this order, later settings winning:
//! 1. `bootstrap.servers`;
//! 2. the runtime's defaults for every client ([`RUNTIME_DEFAULTS`]), then its own settings for
//!    the role (`isolation.level=read_committed` for the stage's consumer, `transactional.id`
//!    for its producer, …) and its `client.id`, prefixed with
//!    [`ClientSettings::client_id_prefix`] when one is set;
//! 3. the user's settings for every client ([`ClientSettings::set`]): security
//!    (`security.protocol`, `sasl.*`, `ssl.*`), timeouts, anything librdkafka takes;
//! 4. the user's settings for the role ([`ClientSettings::set_for`]).
//!
//! So a security setting given once reaches every client, and a user can override any of the
//! runtime's own settings for one role (at their own risk: `isolation.level` and the
//! transactional settings are what exactly-once rests on).
//!
//! ```
//! use parsley_runtime::{ClientRole, ClientSettings};
//!
//! let clients = ClientSettings::new()
//!     .set("security.protocol", "SASL_SSL")
//!     .set("sasl.mechanisms", "SCRAM-SHA-512")
//!     .set("sasl.username", "shop")
//!     .set("sasl.password", "secret")
//!     .set_for(ClientRole::Producer, "compression.type", "lz4")
//!     .client_id_prefix("shop");
//! assert_eq!(clients.get(ClientRole::Restore, "security.protocol"), Some("SASL_SSL"));
//! assert_eq!(clients.get(ClientRole::Producer, "compression.type"), Some("lz4"));
//! assert_eq!(clients.get(ClientRole::Consumer, "compression.type"), None);
//! ```

use rdkafka::ClientConfig;

/// What every client Parsley creates gets before the role's and the user's settings.
///
/// `reconnect.backoff.max.ms` 1,000 (librdkafka's default is 10,000; the Java client's is
/// 1,000): librdkafka asks where a transaction or group coordinator is again only when its
/// connection to the coordinator it knows fails once more, and while that node is dead the
/// reconnection backoff grows to this bound. With 10 s, a transactional producer whose
/// coordinator's node died went on asking the dead node for up to 10 s after Kafka had moved
/// the coordinator, holding the transaction's sends (they wait for their partitions to be
/// added to the transaction); with 1 s it finds the new coordinator within a second or two of
/// the move (`cargo xtask failover`, the benchmarks chapter).
pub const RUNTIME_DEFAULTS: &[(&str, &str)] = &[("reconnect.backoff.max.ms", "1000")];

/// A kind of Kafka client Parsley creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ClientRole {
    /// A stage's consumer of its sources (`read_committed`, explicit positions).
    Consumer,
    /// A stage's transactional producer (outputs and changelog), or a `CausalProducer`'s
    /// producer.
    Producer,
    /// An admin client: topic metadata, offsets, topic creation.
    Admin,
    /// The consumer that reads a task's changelog partition when the task is assigned, and
    /// the one that reads a task's global sources.
    Restore,
}

impl ClientRole {
    /// The role's name: the suffix of the `client.id`s the runtime gives its clients.
    pub fn name(self) -> &'static str {
        match self {
            ClientRole::Consumer => "consumer",
            ClientRole::Producer => "producer",
            ClientRole::Admin => "admin",
            ClientRole::Restore => "restore",
        }
    }
}

/// The user's librdkafka settings for the clients Parsley creates: for every client, and per
/// role (module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientSettings {
    /// For every client, in the order set.
    common: Vec<(String, String)>,
    /// For one role, in the order set.
    by_role: Vec<(ClientRole, String, String)>,
    /// Prepended to every `client.id` the runtime sets (`{prefix}-{id}`).
    client_id_prefix: Option<String>,
}

impl ClientSettings {
    /// No settings: librdkafka's defaults and the runtime's own.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets a librdkafka property on every client.
    pub fn set(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.common.push((key.into(), value.into()));
        self
    }

    /// Sets every property of `properties` on every client, in order.
    pub fn set_all<K: Into<String>, V: Into<String>>(
        mut self,
        properties: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        self.common
            .extend(properties.into_iter().map(|(k, v)| (k.into(), v.into())));
        self
    }

    /// Sets a librdkafka property on the clients of `role` only; it wins over
    /// [`ClientSettings::set`].
    pub fn set_for(
        mut self,
        role: ClientRole,
        key: impl Into<String>,
        value: impl Into<String>,
    ) -> Self {
        self.by_role.push((role, key.into(), value.into()));
        self
    }

    /// Prefixes every `client.id` the runtime sets with `prefix` (`{prefix}-{id}`): the
    /// broker's quotas, logs and metrics then tell this application's clients apart.
    pub fn client_id_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.client_id_prefix = Some(prefix.into());
        self
    }

    /// The value the clients of `role` get for `key` from the user's settings (the last one
    /// set, a role's own winning), if any.
    pub fn get(&self, role: ClientRole, key: &str) -> Option<&str> {
        self.for_role(role)
            .filter(|(k, _)| *k == key)
            .last()
            .map(|(_, v)| v)
    }

    /// The user's settings the clients of `role` get, in the order they are applied.
    pub fn for_role(&self, role: ClientRole) -> impl Iterator<Item = (&str, &str)> + '_ {
        self.common
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .chain(
                self.by_role
                    .iter()
                    .filter(move |(r, _, _)| *r == role)
                    .map(|(_, k, v)| (k.as_str(), v.as_str())),
            )
    }

    /// The configuration of a client of `role` (module docs: the order): `bootstrap`, then
    /// `client.id` = `id` (prefixed), then `own` (the runtime's settings for this client),
    /// then the user's.
    pub(crate) fn config(
        &self,
        bootstrap: &str,
        role: ClientRole,
        id: &str,
        own: &[(&str, &str)],
    ) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", bootstrap);
        match &self.client_id_prefix {
            Some(prefix) => config.set("client.id", format!("{prefix}-{id}")),
            None => config.set("client.id", id),
        };
        for (k, v) in RUNTIME_DEFAULTS.iter().chain(own) {
            config.set(*k, *v);
        }
        for (k, v) in self.for_role(role) {
            config.set(k, v);
        }
        config
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_client_gets_the_runtime_defaults_and_the_user_overrides_them() {
        let plain = ClientSettings::new().config("b:9092", ClientRole::Producer, "g-producer", &[]);
        assert_eq!(plain.get("reconnect.backoff.max.ms"), Some("1000"));
        let user = ClientSettings::new()
            .set("reconnect.backoff.max.ms", "5000")
            .config("b:9092", ClientRole::Admin, "g-admin", &[]);
        assert_eq!(user.get("reconnect.backoff.max.ms"), Some("5000"));
    }

    #[test]
    fn every_client_gets_the_common_settings_and_its_role_wins() {
        let s = ClientSettings::new()
            .set("security.protocol", "SASL_SSL")
            .set_for(ClientRole::Consumer, "fetch.wait.max.ms", "10")
            .set("fetch.wait.max.ms", "20")
            .set_for(ClientRole::Admin, "security.protocol", "SSL");
        for role in [
            ClientRole::Consumer,
            ClientRole::Producer,
            ClientRole::Restore,
        ] {
            let c = s.config("b:1", role, "x", &[("security.protocol", "PLAINTEXT")]);
            assert_eq!(c.get("security.protocol"), Some("SASL_SSL"), "{role:?}");
            assert_eq!(c.get("bootstrap.servers"), Some("b:1"));
        }
        let admin = s.config("b:1", ClientRole::Admin, "x", &[]);
        assert_eq!(admin.get("security.protocol"), Some("SSL"));
        // A role's setting wins over a common one set later.
        let consumer = s.config("b:1", ClientRole::Consumer, "x", &[]);
        assert_eq!(consumer.get("fetch.wait.max.ms"), Some("10"));
        let producer = s.config("b:1", ClientRole::Producer, "x", &[]);
        assert_eq!(producer.get("fetch.wait.max.ms"), Some("20"));
    }

    #[test]
    fn the_runtimes_own_settings_come_before_the_users_and_ids_get_the_prefix() {
        let own = [("isolation.level", "read_committed"), ("linger.ms", "5")];
        let plain =
            ClientSettings::new().config("b:1", ClientRole::Producer, "app.s-producer", &own);
        assert_eq!(plain.get("client.id"), Some("app.s-producer"));
        assert_eq!(plain.get("linger.ms"), Some("5"));
        let user = ClientSettings::new()
            .set_for(ClientRole::Producer, "linger.ms", "50")
            .client_id_prefix("shop")
            .config("b:1", ClientRole::Producer, "app.s-producer", &own);
        assert_eq!(user.get("client.id"), Some("shop-app.s-producer"));
        assert_eq!(user.get("linger.ms"), Some("50"));
        assert_eq!(user.get("isolation.level"), Some("read_committed"));
    }
}
