//! Log lines on stderr, as `--log-format` asks:
//!
//! - `text`, for people (`kubectl logs`): tracing-subscriber's default
//!   format, coloured only on a terminal;
//! - `json`, for a cluster's log pipeline: one JSON object per line
//!   (tracing-subscriber's JSON format, the event's fields beside
//!   `timestamp`, `level`, `target` and `message`), where a field that carries
//!   a JSON document (the drain report) is nested as an object, so the
//!   pipeline can query `report.streams.cut` instead of parsing a string.

use std::fmt;
use std::io::IsTerminal;

use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{Format, Json, JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::EnvFilter;

/// Fields logged as the JSON text of a document (`report = %json`): in JSON
/// logs their value is that document, nested. Text logs show the text.
pub const DOCUMENT_FIELDS: &[&str] = &["report"];

/// `--log-format`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the global subscriber from `--log` (else `default`) and
/// `--log-format`; a filter that does not parse is the error, for exit 64.
pub fn init_from(log: Option<&str>, default: &str, format: LogFormat) -> Result<(), String> {
    let log = log.unwrap_or(default);
    let filter = EnvFilter::try_new(log).map_err(|e| format!("invalid --log {log:?}: {e}"))?;
    init(format, filter);
    Ok(())
}

/// Installs the global subscriber: events that pass `filter`, written to
/// stderr in `format`.
pub fn init(format: LogFormat, filter: EnvFilter) {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder
            // Plain text in `kubectl logs`; colours only on a terminal.
            .with_ansi(std::io::stderr().is_terminal())
            .init(),
        LogFormat::Json => builder
            .fmt_fields(JsonFields::new())
            .event_format(NestedDocuments(json_format()))
            .init(),
    }
}

/// tracing-subscriber's JSON lines, with the event's fields at the top level
/// (where pipelines look for `message`).
fn json_format() -> Format<Json> {
    tracing_subscriber::fmt::format()
        .json()
        .flatten_event(true)
        .with_ansi(false)
}

/// The JSON format, with [`DOCUMENT_FIELDS`] nested as objects.
struct NestedDocuments<F>(F);

impl<S, N, F> FormatEvent<S, N> for NestedDocuments<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'w> tracing_subscriber::fmt::FormatFields<'w> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut line = String::new();
        self.0.format_event(ctx, Writer::new(&mut line), event)?;
        let has_document = event
            .metadata()
            .fields()
            .iter()
            .any(|f| DOCUMENT_FIELDS.contains(&f.name()));
        if has_document {
            if let Some(nested) = nest_documents(&line) {
                return writeln!(writer, "{nested}");
            }
        }
        writer.write_str(&line)
    }
}

/// The JSON line with each of [`DOCUMENT_FIELDS`] whose value is the text of
/// a JSON object replaced by that object, everything else as it was (keys
/// in their order); None when there is none (the line is then written as
/// it was).
fn nest_documents(line: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(line).ok()?;
    let object = value.as_object()?;
    let mut out = line.trim_end().to_string();
    let mut nested = false;
    for name in DOCUMENT_FIELDS {
        let Some(serde_json::Value::String(text)) = object.get(*name) else {
            continue;
        };
        let Ok(doc @ serde_json::Value::Object(_)) = serde_json::from_str(text) else {
            continue;
        };
        // The formatter wrote the string with serde_json too, so this is its
        // exact text; inside a string a quote is escaped, so it can only be
        // the key.
        let (Ok(key), Ok(quoted)) = (
            serde_json::to_string(name),
            serde_json::to_string(&serde_json::Value::String(text.clone())),
        ) else {
            continue;
        };
        // The document as logged (its keys in their order), unless it spans
        // lines.
        let doc = if text.contains('\n') {
            doc.to_string()
        } else {
            text.clone()
        };
        let needle = format!("{key}:{quoted}");
        if out.contains(&needle) {
            out = out.replacen(&needle, &format!("{key}:{doc}"), 1);
            nested = true;
        }
    }
    // Never write a line that no longer parses.
    (nested && serde_json::from_str::<serde_json::Value>(&out).is_ok()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_field_becomes_an_object() {
        let line = r#"{"timestamp":"t","level":"INFO","message":"drain done","report":"{\"outcome\":\"quiesced\",\"streams\":{\"cut\":0}}","target":"drainshim::drain::driver"}"#;
        let out = nest_documents(line).expect("nested");
        let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
        assert_eq!(v["report"]["outcome"], "quiesced");
        assert_eq!(v["report"]["streams"]["cut"], 0);
        assert_eq!(v["message"], "drain done");
        assert_eq!(v["target"], "drainshim::drain::driver");
        // Keys keep their order, the report's too.
        assert!(out.starts_with(r#"{"timestamp":"t","level":"INFO","message":"drain done","report":{"outcome":"quiesced","streams":{"cut":0}},"target""#), "{out}");
    }

    #[test]
    fn a_document_over_several_lines_is_nested_on_one() {
        let line = r#"{"message":"m","report":"{\n  \"outcome\": \"deadline\"\n}"}"#;
        let out = nest_documents(line).expect("nested");
        assert!(!out.contains('\n'), "{out}");
        let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
        assert_eq!(v["report"]["outcome"], "deadline");
    }

    #[test]
    fn other_fields_and_non_documents_stay_as_they_are() {
        // Not a JSON object: the line is left alone.
        assert_eq!(
            nest_documents(r#"{"message":"x","report":"not json"}"#),
            None
        );
        assert_eq!(nest_documents(r#"{"message":"x","report":"[1,2]"}"#), None);
        assert_eq!(nest_documents(r#"{"message":"x","error":"{}"}"#), None);
        assert_eq!(nest_documents("not a line"), None);
    }
}
