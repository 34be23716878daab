//! Subject names: under which subject a codec registers its writer schema, as Confluent's
//! serializers name it (`key.subject.name.strategy`, `value.subject.name.strategy`).

use crate::SchemaError;

/// Whether a codec writes record keys or values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The record key (`{topic}-key` under [`SubjectNameStrategy::TopicName`]).
    Key,
    /// The record value (`{topic}-value`).
    Value,
}

/// How a subject is named from the topic, the part and the schema's record name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SubjectNameStrategy {
    /// `{topic}-key` or `{topic}-value`: one schema (with its versions) per topic and part.
    /// Confluent's default (`TopicNameStrategy`).
    #[default]
    TopicName,
    /// The record's full name (Avro: `namespace.name`; Protobuf: `package.Message`; JSON
    /// Schema: its `title`), whatever the topic: one record type in many topics
    /// (`RecordNameStrategy`).
    RecordName,
    /// `{topic}-{record full name}`: many record types in one topic, each evolving on its own
    /// (`TopicRecordNameStrategy`).
    TopicRecordName,
}

impl SubjectNameStrategy {
    /// The subject for `topic`, `part` and the schema's `record` name.
    ///
    /// # Errors
    /// [`SchemaError::NoRecordName`] when the strategy needs a record name and there is none.
    pub fn subject(
        self,
        topic: &str,
        part: Part,
        record: Option<&str>,
    ) -> Result<String, SchemaError> {
        match self {
            SubjectNameStrategy::TopicName => Ok(match part {
                Part::Key => format!("{topic}-key"),
                Part::Value => format!("{topic}-value"),
            }),
            SubjectNameStrategy::RecordName => {
                record.map(str::to_string).ok_or(SchemaError::NoRecordName)
            }
            SubjectNameStrategy::TopicRecordName => record
                .map(|r| format!("{topic}-{r}"))
                .ok_or(SchemaError::NoRecordName),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_strategy_names_the_subject_as_confluent_does() {
        let s = SubjectNameStrategy::TopicName;
        assert_eq!(s.subject("orders", Part::Key, None).unwrap(), "orders-key");
        assert_eq!(
            s.subject("orders", Part::Value, Some("shop.Order"))
                .unwrap(),
            "orders-value"
        );
        let s = SubjectNameStrategy::RecordName;
        assert_eq!(
            s.subject("orders", Part::Value, Some("shop.Order"))
                .unwrap(),
            "shop.Order"
        );
        assert!(matches!(
            s.subject("orders", Part::Value, None),
            Err(SchemaError::NoRecordName)
        ));
        let s = SubjectNameStrategy::TopicRecordName;
        assert_eq!(
            s.subject("orders", Part::Key, Some("shop.Order")).unwrap(),
            "orders-shop.Order"
        );
    }
}
