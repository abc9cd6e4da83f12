//! A small client for Prometheus' HTTP API (`/api/v1/query` and
//! `/api/v1/query_range`). Prometheus is the fleet's aggregation engine and
//! its memory; drainshim only asks it questions.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::StatusCode;
use serde::Deserialize;

use super::reach::{Access, PromUrl, Reach, ReachError};

/// Prometheus error, with the query that failed.
#[derive(Debug, thiserror::Error)]
pub enum PromError {
    /// A bad URL, an unreadable credential or CA file, a bad header (64).
    #[error("{0}")]
    Setup(String),
    #[error("prometheus {url}: {what}")]
    Unreachable { url: String, what: String },
    /// Prometheus (or the gateway in front of it) refused the request:
    /// 401 or 403 (77).
    #[error("prometheus {url}: refused ({status}): {hint}")]
    Refused {
        url: String,
        status: StatusCode,
        hint: &'static str,
    },
    #[error("prometheus {url}: query {query:?} failed: {what}")]
    Query {
        url: String,
        query: String,
        what: String,
    },
}

/// One sample of an instant vector: labels and value.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Sample {
    pub fn label(&self, name: &str) -> &str {
        self.labels.get(name).map_or("", String::as_str)
    }
}

#[derive(Clone, Debug)]
pub struct PromClient {
    /// Prometheus' URL (its path prefix is put before every API path), TLS
    /// and credentials.
    reach: Reach,
    /// Bound of each query.
    timeout: Duration,
    /// The evaluation time of every query; `None` is Prometheus' now.
    at: Option<SystemTime>,
}

#[derive(Deserialize)]
struct Response {
    status: String,
    #[serde(default)]
    data: Option<Data>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
struct Data {
    #[serde(rename = "resultType")]
    result_type: String,
    #[serde(default)]
    result: Vec<VectorSample>,
}

#[derive(Deserialize)]
struct VectorSample {
    metric: BTreeMap<String, String>,
    /// `[timestamp, "value"]` in a vector; absent in a matrix.
    #[serde(default)]
    value: Option<(f64, String)>,
    /// `[[timestamp, "value"], ...]` in a matrix.
    #[serde(default)]
    values: Vec<(f64, String)>,
}

/// One series of a range query: labels, and its (Unix seconds, value)
/// points in time order; a step where the series had no sample is absent.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub labels: BTreeMap<String, String>,
    pub points: Vec<(f64, f64)>,
}

impl Series {
    pub fn label(&self, name: &str) -> &str {
        self.labels.get(name).map_or("", String::as_str)
    }
}

impl PromClient {
    /// A client of a plain Prometheus, no credentials.
    pub fn new(url: &str, timeout: Duration) -> Result<Self, PromError> {
        let url: PromUrl = url.parse().map_err(PromError::Setup)?;
        let reach =
            Reach::new(url, &Access::default()).map_err(|e| PromError::Setup(e.to_string()))?;
        Ok(Self::from_reach(reach, timeout))
    }

    /// A client that reaches Prometheus as `reach` says (https, credentials,
    /// headers).
    pub fn from_reach(reach: Reach, timeout: Duration) -> Self {
        Self {
            reach,
            timeout,
            at: None,
        }
    }

    /// Evaluates every query at `at` instead of now.
    pub fn at(mut self, at: Option<SystemTime>) -> Self {
        self.at = at;
        self
    }

    /// Prometheus' URL, for messages.
    pub fn url(&self) -> String {
        self.reach.url().to_string()
    }

    /// Runs an instant query; only vector results are accepted.
    pub async fn query(&self, query: &str) -> Result<Vec<Sample>, PromError> {
        let mut form = format!("query={}", crate::http::encode_query(query));
        if let Some(at) = self.at {
            form.push_str(&format!("&time={:.3}", unix(at)));
        }
        let (status, body) = self.post("/api/v1/query", form).await?;
        decode_answer(status, &body).map_err(|what| PromError::Query {
            url: self.url(),
            query: query.to_string(),
            what,
        })
    }

    /// Runs a range query from `start` to `end` every `step`; only matrix
    /// results are accepted.
    pub async fn query_range(
        &self,
        query: &str,
        start: SystemTime,
        end: SystemTime,
        step: Duration,
    ) -> Result<Vec<Series>, PromError> {
        let form = format!(
            "query={}&start={:.3}&end={:.3}&step={:.3}",
            crate::http::encode_query(query),
            unix(start),
            unix(end),
            step.as_secs_f64().max(0.001)
        );
        let (status, body) = self.post("/api/v1/query_range", form).await?;
        decode_matrix(status, &body).map_err(|what| PromError::Query {
            url: self.url(),
            query: query.to_string(),
            what,
        })
    }

    /// Posts a query form to an API path; a refusal (401, 403) is its own
    /// error, any other status is left to the decoder, which reports
    /// Prometheus' own error.
    async fn post(
        &self,
        path: &str,
        form: String,
    ) -> Result<(StatusCode, bytes::Bytes), PromError> {
        let asked = std::time::Instant::now();
        let (status, body) = self
            .reach
            .post_form(path, form, self.timeout)
            .await
            .map_err(|e| match e {
                ReachError::Setup(what) => PromError::Setup(what),
                ReachError::Unreachable(what) => PromError::Unreachable {
                    url: self.url(),
                    what,
                },
            })?;
        // What each answer cost, for `bench fleet` (and anyone tuning a
        // slow store): one line per query at debug.
        tracing::debug!(
            bytes = body.len(),
            ms = asked.elapsed().as_millis() as u64,
            "prometheus: answered"
        );
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(PromError::Refused {
                url: self.url(),
                status,
                hint: self.reach.refused_hint(),
            });
        }
        Ok((status, body))
    }

    /// The sum of a query's samples; an empty answer is 0.
    pub async fn scalar(&self, query: &str) -> Result<f64, PromError> {
        Ok(self.query(query).await?.iter().map(|s| s.value).sum())
    }
}

/// Decodes an `/api/v1/query` answer into its samples; only a successful
/// vector answer is accepted. The error says what was wrong with the answer.
pub fn decode_answer(status: StatusCode, body: &[u8]) -> Result<Vec<Sample>, String> {
    let data = answer(status, body)?;
    if data.result_type != "vector" {
        return Err(format!("expected a vector, got {}", data.result_type));
    }
    data.result
        .into_iter()
        .map(|s| {
            let (_, v) = s.value.ok_or("a vector sample without a value")?;
            Ok(Sample {
                labels: s.metric,
                value: number(&v)?,
            })
        })
        .collect()
}

/// Decodes an `/api/v1/query_range` answer into its series.
pub fn decode_matrix(status: StatusCode, body: &[u8]) -> Result<Vec<Series>, String> {
    let data = answer(status, body)?;
    if data.result_type != "matrix" {
        return Err(format!("expected a matrix, got {}", data.result_type));
    }
    data.result
        .into_iter()
        .map(|s| {
            let points = s
                .values
                .iter()
                .map(|(t, v)| Ok((*t, number(v)?)))
                .collect::<Result<_, String>>()?;
            Ok(Series {
                labels: s.metric,
                points,
            })
        })
        .collect()
}

fn number(v: &str) -> Result<f64, String> {
    v.parse::<f64>()
        .map_err(|_| format!("bad sample value {v:?}"))
}

fn unix(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

/// The data of a successful answer, or what was wrong with it.
fn answer(status: StatusCode, body: &[u8]) -> Result<Data, String> {
    let resp: Response = serde_json::from_slice(body).map_err(|e| {
        format!(
            "status {status}, not a Prometheus API answer ({e}): {}",
            String::from_utf8_lossy(body)
                .chars()
                .take(200)
                .collect::<String>()
        )
    })?;
    if status != StatusCode::OK || resp.status != "success" {
        return Err(resp.error.unwrap_or_else(|| format!("status {status}")));
    }
    resp.data.ok_or_else(|| "no data in the answer".to_string())
}

/// Quotes a value for a PromQL regex matcher built from literal names.
pub fn regex_alternation(values: &[String]) -> String {
    values
        .iter()
        .map(|v| regex::escape(v).replace('\\', "\\\\").replace('"', "\\\""))
        .collect::<Vec<_>>()
        .join("|")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let t = Duration::from_secs(1);
        let c = PromClient::new("http://127.0.0.1:9090/prom/", t).unwrap();
        assert_eq!(c.url(), "http://127.0.0.1:9090/prom");
        assert!(PromClient::new("127.0.0.1:9090", t).is_err());
    }

    #[test]
    fn alternation_escapes() {
        assert_eq!(regex_alternation(&["a.b".into(), "c".into()]), r"a\\.b|c");
    }
}
