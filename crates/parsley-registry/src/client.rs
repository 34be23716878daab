//! A small blocking client of a schema registry's Confluent-compatible REST API (Confluent
//! Schema Registry, Apicurio Registry's `/apis/ccompat/v7`, Karapace, or the checkout's local
//! one: `cargo kafka registry up`).
//!
//! It registers a schema under a subject, looks one up, and fetches a schema by id; both
//! directions are cached for the client's life (a schema id never changes meaning in a
//! registry, and a registered schema keeps its id), so a codec asks the registry once per
//! schema and once per id it reads.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use crate::SchemaError;

/// The content type of the registry's API.
const CONTENT_TYPE: &str = "application/vnd.schemaregistry.v1+json";

/// A schema's format, as the registry names it in `schemaType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SchemaKind {
    /// Apache Avro (`AVRO`, the registry's default).
    Avro,
    /// Protocol Buffers (`PROTOBUF`): the schema is a `.proto` file's text.
    Protobuf,
    /// JSON Schema (`JSON`).
    Json,
}

impl SchemaKind {
    /// The registry's name for it.
    pub fn name(self) -> &'static str {
        match self {
            SchemaKind::Avro => "AVRO",
            SchemaKind::Protobuf => "PROTOBUF",
            SchemaKind::Json => "JSON",
        }
    }

    fn parse(name: Option<&str>) -> Option<SchemaKind> {
        match name.unwrap_or("AVRO") {
            "AVRO" => Some(SchemaKind::Avro),
            "PROTOBUF" => Some(SchemaKind::Protobuf),
            "JSON" => Some(SchemaKind::Json),
            _ => None,
        }
    }
}

impl fmt::Display for SchemaKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A schema: its format and its text.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Schema {
    /// The format.
    pub kind: SchemaKind,
    /// The text (Avro and JSON Schema: JSON; Protobuf: a `.proto` file).
    pub text: String,
}

/// A blocking client of one registry, with its caches. Share it between codecs (`Arc`).
#[derive(Debug)]
pub struct RegistryClient {
    base: String,
    timeout_s: u64,
    by_id: Mutex<HashMap<u32, Arc<Schema>>>,
    ids: Mutex<HashMap<(String, Schema), u32>>,
}

impl RegistryClient {
    /// A client of the registry at `base_url` (`http://host:port`, with a path prefix if the
    /// API has one, such as Apicurio's `/apis/ccompat/v7`), with requests timing out after
    /// 30 s. Plain HTTP only.
    pub fn new(base_url: &str) -> RegistryClient {
        RegistryClient {
            base: base_url.trim_end_matches('/').to_string(),
            timeout_s: 30,
            by_id: Mutex::default(),
            ids: Mutex::default(),
        }
    }

    /// The same with requests timing out after `seconds`.
    pub fn with_timeout(mut self, seconds: u64) -> RegistryClient {
        self.timeout_s = seconds;
        self
    }

    /// The base URL.
    pub fn url(&self) -> &str {
        &self.base
    }

    /// Registers `schema` under `subject` (a new version unless the subject has it) and
    /// returns its id. Cached: a second call asks nothing.
    ///
    /// # Errors
    /// [`SchemaError::Registry`] when the registry refuses (an invalid schema: 42201; an
    /// incompatible one: 409), [`SchemaError::Transport`] when it cannot be reached.
    pub fn register(&self, subject: &str, schema: &Schema) -> Result<u32, SchemaError> {
        let key = (subject.to_string(), schema.clone());
        if let Some(id) = lock(&self.ids).get(&key) {
            return Ok(*id);
        }
        let url = format!(
            "{}/subjects/{}/versions",
            self.base,
            encode_segment(subject)
        );
        let answer = self.request("POST", &url, Some(body(schema)))?;
        let id = id_of(&answer, &url)?;
        lock(&self.ids).insert(key, id);
        lock(&self.by_id).insert(id, Arc::new(schema.clone()));
        Ok(id)
    }

    /// The id of `schema` under `subject`, or `None` when the subject does not hold it (or
    /// does not exist). Cached when found.
    ///
    /// # Errors
    /// As [`RegistryClient::register`].
    pub fn lookup(&self, subject: &str, schema: &Schema) -> Result<Option<u32>, SchemaError> {
        let key = (subject.to_string(), schema.clone());
        if let Some(id) = lock(&self.ids).get(&key) {
            return Ok(Some(*id));
        }
        let url = format!("{}/subjects/{}", self.base, encode_segment(subject));
        match self.request("POST", &url, Some(body(schema))) {
            Ok(answer) => {
                let id = id_of(&answer, &url)?;
                lock(&self.ids).insert(key, id);
                Ok(Some(id))
            }
            Err(SchemaError::Registry {
                status: 404,
                code: Some(40401 | 40403),
                ..
            }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The schema of `id`. Cached.
    ///
    /// # Errors
    /// [`SchemaError::UnknownSchemaId`] when the registry has none, [`SchemaError::Transport`]
    /// when it cannot be reached or answers with another shape.
    pub fn schema(&self, id: u32) -> Result<Arc<Schema>, SchemaError> {
        if let Some(schema) = lock(&self.by_id).get(&id) {
            return Ok(Arc::clone(schema));
        }
        let url = format!("{}/schemas/ids/{id}", self.base);
        let answer = match self.request("GET", &url, None) {
            Err(SchemaError::Registry { status: 404, .. }) => {
                return Err(SchemaError::UnknownSchemaId(id));
            }
            other => other?,
        };
        let text = answer.get("schema").and_then(Value::as_str);
        let kind = SchemaKind::parse(answer.get("schemaType").and_then(Value::as_str));
        let (Some(text), Some(kind)) = (text, kind) else {
            return Err(SchemaError::Transport {
                url,
                reason: format!("not a schema: {answer}"),
            });
        };
        let schema = Arc::new(Schema {
            kind,
            text: text.to_string(),
        });
        lock(&self.by_id).insert(id, Arc::clone(&schema));
        Ok(schema)
    }

    /// The registry's subjects. Not cached.
    ///
    /// # Errors
    /// As [`RegistryClient::register`].
    pub fn subjects(&self) -> Result<Vec<String>, SchemaError> {
        let url = format!("{}/subjects", self.base);
        let answer = self.request("GET", &url, None)?;
        serde_json::from_value(answer.clone()).map_err(|_| SchemaError::Transport {
            url,
            reason: format!("not a list of subjects: {answer}"),
        })
    }

    /// The versions of `subject` (1, 2, …). Not cached.
    ///
    /// # Errors
    /// [`SchemaError::Registry`] with code 40401 when there is no such subject.
    pub fn versions(&self, subject: &str) -> Result<Vec<u32>, SchemaError> {
        let url = format!(
            "{}/subjects/{}/versions",
            self.base,
            encode_segment(subject)
        );
        let answer = self.request("GET", &url, None)?;
        serde_json::from_value(answer.clone()).map_err(|_| SchemaError::Transport {
            url,
            reason: format!("not a list of versions: {answer}"),
        })
    }

    fn request(&self, method: &str, url: &str, body: Option<Value>) -> Result<Value, SchemaError> {
        let transport = |reason: String| SchemaError::Transport {
            url: url.to_string(),
            reason,
        };
        let request = match method {
            "POST" => minreq::post(url),
            _ => minreq::get(url),
        }
        .with_header("Accept", CONTENT_TYPE)
        .with_timeout(self.timeout_s);
        let request = match body {
            Some(body) => request
                .with_header("Content-Type", CONTENT_TYPE)
                .with_body(body.to_string()),
            None => request,
        };
        let response = request.send().map_err(|e| transport(e.to_string()))?;
        let text = String::from_utf8_lossy(response.as_bytes()).into_owned();
        let answer: Option<Value> = serde_json::from_str(&text).ok();
        if !(200..300).contains(&response.status_code) {
            let code = answer
                .as_ref()
                .and_then(|a| a.get("error_code"))
                .and_then(Value::as_u64)
                .and_then(|c| u32::try_from(c).ok());
            let message = answer
                .as_ref()
                .and_then(|a| a.get("message"))
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or(text);
            return Err(SchemaError::Registry {
                url: url.to_string(),
                status: response.status_code,
                code,
                message,
            });
        }
        answer.ok_or_else(|| transport(format!("an answer that is not JSON: {text}")))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn body(schema: &Schema) -> Value {
    let mut body = json!({ "schema": schema.text });
    if schema.kind != SchemaKind::Avro {
        body["schemaType"] = json!(schema.kind.name());
    }
    body
}

fn id_of(answer: &Value, url: &str) -> Result<u32, SchemaError> {
    answer
        .get("id")
        .and_then(Value::as_u64)
        .and_then(|id| u32::try_from(id).ok())
        .ok_or_else(|| SchemaError::Transport {
            url: url.to_string(),
            reason: format!("no schema id in {answer}"),
        })
}

/// `subject` as one path segment: every byte but unreserved ones percent-encoded.
fn encode_segment(subject: &str) -> String {
    let mut out = String::with_capacity(subject.len());
    for b in subject.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_are_one_path_segment() {
        assert_eq!(encode_segment("orders-value"), "orders-value");
        assert_eq!(encode_segment("a/b c"), "a%2Fb%20c");
    }

    #[test]
    fn an_unreachable_registry_is_a_transport_error() {
        let client = RegistryClient::new("http://127.0.0.1:1").with_timeout(2);
        assert!(matches!(
            client.schema(1),
            Err(SchemaError::Transport { .. })
        ));
    }
}
