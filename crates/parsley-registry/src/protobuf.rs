//! [`ProtobufCodec`]: `prost` messages in the Confluent wire format, with message indexes.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use parsley_stage::{Codec, CodecError};

use crate::codec::{Target, lock};
use crate::{Part, RegistryClient, Schema, SchemaError, SchemaKind, SubjectNameStrategy, wire};

/// The messages of a writer's schema by their indexes.
type Messages = Arc<HashMap<Vec<i32>, String>>;

/// A `prost` message `T` as its Protobuf bytes after the header and the message indexes of
/// the codec's message in its `.proto` file.
///
/// - **Encode** registers the `.proto` text under the strategy's subject once (the record
///   name is the message's full name, `package.Outer.Inner`), then writes the header, the
///   message's indexes in the file and `prost`'s bytes.
/// - **Decode** reads the schema id and the indexes, finds which message of the writer's
///   `.proto` (fetched once per id) the indexes name, checks that it has the codec's full
///   name, and decodes the bytes as `T` (Protobuf's own evolution rules: unknown fields are
///   skipped, missing ones take their defaults).
///
/// The `.proto` text is read for its `package`, `message` declarations and `map` fields (a
/// map field is a nested message of the descriptor, and counts in the indexes); `import`ed
/// files (schema references) and proto2 groups are not supported.
pub struct ProtobufCodec<T> {
    target: Target,
    indexes: Vec<i32>,
    message: String,
    writers: Mutex<HashMap<u32, Messages>>,
    _type: PhantomData<fn(T) -> T>,
}

impl<T> std::fmt::Debug for ProtobufCodec<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProtobufCodec")
            .field("subject", &self.target.subject)
            .field("message", &self.message)
            .finish_non_exhaustive()
    }
}

impl<T> ProtobufCodec<T> {
    /// A codec of `topic`'s `part` for the message `message` (full name, `package.Message`)
    /// of the `.proto` text `schema`, under [`SubjectNameStrategy::TopicName`]'s subject. Asks
    /// the registry nothing yet.
    ///
    /// # Errors
    /// [`SchemaError::InvalidSchema`] when `schema` does not declare `message`.
    pub fn new(
        registry: Arc<RegistryClient>,
        topic: &str,
        part: Part,
        schema: &str,
        message: &str,
    ) -> Result<ProtobufCodec<T>, SchemaError> {
        let messages = message_indexes(schema)
            .map_err(|reason| SchemaError::InvalidSchema { id: None, reason })?;
        let indexes = messages
            .iter()
            .find(|(_, name)| name.as_str() == message)
            .map(|(i, _)| i.clone())
            .ok_or_else(|| SchemaError::InvalidSchema {
                id: None,
                reason: format!("no message {message} in the schema"),
            })?;
        let target = Target::new(
            registry,
            topic,
            part,
            Some(message.to_string()),
            Schema {
                kind: SchemaKind::Protobuf,
                text: schema.to_string(),
            },
        )?;
        Ok(ProtobufCodec {
            target,
            indexes,
            message: message.to_string(),
            writers: Mutex::default(),
            _type: PhantomData,
        })
    }

    /// The same, naming the subject by `strategy` (the message's full name as record name).
    ///
    /// # Errors
    /// None in practice (a message always has a name); the signature matches the other codecs'.
    pub fn with_strategy(mut self, strategy: SubjectNameStrategy) -> Result<Self, SchemaError> {
        self.target.set_strategy(strategy)?;
        Ok(self)
    }

    /// The same, never registering (see [`crate::AvroCodec::lookup_only`]).
    pub fn lookup_only(mut self) -> Self {
        self.target.register = false;
        self
    }

    /// The subject the codec registers its schema under.
    pub fn subject(&self) -> &str {
        &self.target.subject
    }

    /// The message indexes the codec writes.
    pub fn message_indexes(&self) -> &[i32] {
        &self.indexes
    }

    /// The messages of the writer schema `id` by their indexes, read once per id.
    fn writer(&self, id: u32) -> Result<Messages, SchemaError> {
        if let Some(w) = lock(&self.writers).get(&id) {
            return Ok(Arc::clone(w));
        }
        let schema = self.target.check_writer(id, SchemaKind::Protobuf)?;
        let messages = message_indexes(&schema.text)
            .map_err(|reason| SchemaError::InvalidSchema {
                id: Some(id),
                reason,
            })?
            .into_iter()
            .collect::<HashMap<_, _>>();
        let messages = Arc::new(messages);
        lock(&self.writers).insert(id, Arc::clone(&messages));
        Ok(messages)
    }
}

impl<T: prost::Message + Default> Codec<T> for ProtobufCodec<T> {
    fn encode(&self, value: &T) -> Result<Vec<u8>, CodecError> {
        let id = self.target.id()?;
        let mut out = wire::header(id).to_vec();
        wire::write_message_indexes(&self.indexes, &mut out);
        value
            .encode(&mut out)
            .map_err(|e| SchemaError::Encode(e.to_string()))?;
        Ok(out)
    }

    fn decode(&self, bytes: &[u8]) -> Result<T, CodecError> {
        let (id, rest) = wire::split(bytes)?;
        let (indexes, payload) = wire::read_message_indexes(rest, wire::HEADER_LEN)?;
        let writer = self.writer(id)?;
        let bad = |reason: String| SchemaError::Payload { id, reason };
        match writer.get(&indexes) {
            Some(name) if *name == self.message => {}
            Some(name) => {
                return Err(bad(format!(
                    "written as message {name}, the codec reads {}",
                    self.message
                ))
                .into());
            }
            None => {
                return Err(bad(format!(
                    "message indexes {indexes:?} name no message of the writer's schema"
                ))
                .into());
            }
        }
        Ok(T::decode(payload).map_err(|e| bad(e.to_string()))?)
    }
}

/// Every message of a `.proto` file's text with its indexes: the position of each top-level
/// message among the file's messages, then of each nested one among its parent's nested
/// messages (map fields included, as the descriptor has them).
///
/// # Errors
/// A description when braces do not balance or a declaration is cut off.
pub fn message_indexes(proto: &str) -> Result<Vec<(Vec<i32>, String)>, String> {
    let tokens = tokenize(proto)?;
    // The open scopes: for a message, its name and its indexes; every scope counts the
    // messages declared in it so far.
    struct Scope {
        message: Option<(String, Vec<i32>)>,
        children: i32,
    }
    let mut package = String::new();
    let mut scopes = vec![Scope {
        message: None,
        children: 0,
    }];
    let mut out = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let token = tokens[i].as_str();
        let in_message = scopes.last().is_some_and(|s| s.message.is_some());
        match token {
            "package" if scopes.len() == 1 => {
                package = tokens.get(i + 1).cloned().ok_or("package without a name")?;
                i += 2;
                continue;
            }
            "message" if tokens.get(i + 2).map(String::as_str) == Some("{") => {
                let name = tokens[i + 1].clone();
                let parent = scopes.last_mut().ok_or("unbalanced braces")?;
                let index = parent.children;
                parent.children += 1;
                let (full, mut indexes) = match &parent.message {
                    Some((parent_name, parent_indexes)) => {
                        (format!("{parent_name}.{name}"), parent_indexes.clone())
                    }
                    None if package.is_empty() => (name, Vec::new()),
                    None => (format!("{package}.{name}"), Vec::new()),
                };
                indexes.push(index);
                out.push((indexes.clone(), full.clone()));
                scopes.push(Scope {
                    message: Some((full, indexes)),
                    children: 0,
                });
                i += 3;
                continue;
            }
            "map" if in_message && tokens.get(i + 1).map(String::as_str) == Some("<") => {
                if let Some(scope) = scopes.last_mut() {
                    scope.children += 1;
                }
            }
            "{" => scopes.push(Scope {
                message: None,
                children: 0,
            }),
            "}" => {
                scopes.pop();
                if scopes.is_empty() {
                    return Err("a closing brace without an opening one".into());
                }
            }
            _ => {}
        }
        i += 1;
    }
    if scopes.len() != 1 {
        return Err("a declaration is not closed".into());
    }
    Ok(out)
}

/// The tokens of a `.proto` text: names (dotted), numbers, string literals and single
/// punctuation characters, without comments.
fn tokenize(text: &str) -> Result<Vec<String>, String> {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '/' && chars.get(i + 1) == Some(&'/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && chars.get(i + 1) == Some(&'*') {
            i += 2;
            while i < chars.len() && !(chars[i] == '*' && chars.get(i + 1) == Some(&'/')) {
                i += 1;
            }
            if i >= chars.len() {
                return Err("a comment is not closed".into());
            }
            i += 2;
        } else if c == '"' || c == '\'' {
            let start = i;
            i += 1;
            while i < chars.len() && chars[i] != c {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            if i >= chars.len() {
                return Err("a string is not closed".into());
            }
            i += 1;
            tokens.push(chars[start..i].iter().collect());
        } else if c.is_alphanumeric() || c == '_' || c == '.' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_alphanumeric() || chars[i] == '_' || chars[i] == '.')
            {
                i += 1;
            }
            tokens.push(chars[start..i].iter().collect());
        } else {
            tokens.push(c.to_string());
            i += 1;
        }
    }
    Ok(tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROTO: &str = r#"
        syntax = "proto3";
        package shop.v1;
        // message Commented { }
        /* message Blocked { } */
        message Order {
          string id = 1;
          map<string, int64> counts = 2;
          message Line { string sku = 1; enum Kind { A = 0; } message Note { string t = 1; } }
          oneof pay { string card = 3; string cash = 4; }
        }
        enum Status { NEW = 0; }
        service Orders { rpc Get (Order) returns (Order) { option (x) = { a: "}" }; } }
        message Customer { string name = 1 [json_name = "message"]; }
    "#;

    #[test]
    fn indexes_follow_the_descriptor_with_map_entries_counted() {
        let got = message_indexes(PROTO).unwrap();
        assert_eq!(
            got,
            vec![
                (vec![0], "shop.v1.Order".to_string()),
                // The map field's entry is nested message 0 of Order.
                (vec![0, 1], "shop.v1.Order.Line".to_string()),
                (vec![0, 1, 0], "shop.v1.Order.Line.Note".to_string()),
                (vec![1], "shop.v1.Customer".to_string()),
            ]
        );
    }

    #[test]
    fn broken_texts_are_errors() {
        assert!(message_indexes("message A {").is_err());
        assert!(message_indexes("message A { } }").is_err());
        assert!(message_indexes("/* open").is_err());
        assert!(message_indexes("message A { string s = 1 [default = \"x]; }").is_err());
    }
}
