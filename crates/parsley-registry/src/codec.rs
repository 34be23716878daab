//! What every codec shares: the subject it writes under and the id of its writer schema.

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::{Part, RegistryClient, Schema, SchemaError, SubjectNameStrategy};

/// Where a codec's writer schema goes: the registry, the subject, and its id once known.
#[derive(Debug)]
pub(crate) struct Target {
    pub(crate) registry: Arc<RegistryClient>,
    topic: String,
    part: Part,
    record: Option<String>,
    pub(crate) subject: String,
    schema: Schema,
    pub(crate) register: bool,
    id: OnceLock<u32>,
}

impl Target {
    pub(crate) fn new(
        registry: Arc<RegistryClient>,
        topic: &str,
        part: Part,
        record: Option<String>,
        schema: Schema,
    ) -> Result<Target, SchemaError> {
        let subject = SubjectNameStrategy::TopicName.subject(topic, part, record.as_deref())?;
        Ok(Target {
            registry,
            topic: topic.to_string(),
            part,
            record,
            subject,
            schema,
            register: true,
            id: OnceLock::new(),
        })
    }

    pub(crate) fn set_strategy(
        &mut self,
        strategy: SubjectNameStrategy,
    ) -> Result<(), SchemaError> {
        self.subject = strategy.subject(&self.topic, self.part, self.record.as_deref())?;
        Ok(())
    }

    /// The id of the writer schema: registered (or looked up) at the first call.
    pub(crate) fn id(&self) -> Result<u32, SchemaError> {
        if let Some(id) = self.id.get() {
            return Ok(*id);
        }
        let id = if self.register {
            self.registry.register(&self.subject, &self.schema)?
        } else {
            self.registry
                .lookup(&self.subject, &self.schema)?
                .ok_or_else(|| SchemaError::Registry {
                    url: self.registry.url().to_string(),
                    status: 404,
                    code: Some(40403),
                    message: format!(
                        "the subject {} does not hold the codec's schema (lookup only)",
                        self.subject
                    ),
                })?
        };
        Ok(*self.id.get_or_init(|| id))
    }

    /// Checks that `id` names a schema of `kind` in the registry (fetched once per id).
    pub(crate) fn check_writer(
        &self,
        id: u32,
        kind: crate::SchemaKind,
    ) -> Result<Arc<Schema>, SchemaError> {
        let schema = self.registry.schema(id)?;
        if schema.kind != kind {
            return Err(SchemaError::WrongSchemaType {
                id,
                expected: kind.name(),
                found: schema.kind.to_string(),
            });
        }
        Ok(schema)
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
