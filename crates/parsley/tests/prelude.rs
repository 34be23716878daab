//! The facade's prelude is enough for a DSL pipeline and a hand-written stage side by side.

use parsley::prelude::*;

struct Upper;
impl Handler for Upper {
    type Key = String;
    type Value = String;
    type Output = String;
    type State = ();
    fn handle(
        &self,
        r: Record<'_, String, String>,
        _: Option<()>,
    ) -> Result<Step<String, String, ()>, HandlerError> {
        Ok(Step::none().emit("upper", r.key, r.value.to_uppercase()))
    }
}

#[test]
fn a_dsl_pipeline_and_a_handler_stage_build_from_the_prelude() {
    let builder = StreamsBuilder::new("app");
    builder
        .stream::<String, String>("words")
        .group_by_key()
        .count()
        .to_stream()
        .to("counts");
    let topology = builder.build().unwrap();
    assert_eq!(topology.stages()[0].sources(), ["words"]);
    assert!(
        topology
            .describe()
            .to_string()
            .contains("count-0001: count")
    );

    let handwritten = Topology::builder("app")
        .stage("upper", Upper, |s| {
            s.source("words").sink("upper").key_codec(Utf8)
        })
        .build()
        .unwrap();
    assert_eq!(handwritten.stages()[0].sinks(), ["upper"]);
    // A stage's build error converts into the runtime's error with `?`.
    let err: parsley::Error = Topology::builder("app").build().unwrap_err().into();
    assert!(
        matches!(
            err,
            parsley::Error::Processing(parsley::error::ProcessingError::Stage(_))
        ),
        "{err}"
    );
}
