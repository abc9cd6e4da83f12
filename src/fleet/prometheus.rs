//! A small client for Prometheus' HTTP API (`/api/v1/query`). Prometheus is
//! the fleet's aggregation engine; drainshim only asks it questions.

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
    /// `[timestamp, "value"]`
    value: (f64, String),
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
        let mut path = format!("/api/v1/query?query={}", crate::http::encode_query(query));
        if let Some(at) = self.at {
            let secs = at.duration_since(UNIX_EPOCH).unwrap_or_default();
            path.push_str(&format!("&time={:.3}", secs.as_secs_f64()));
        }
        let (status, body) = self
            .reach
            .get(&path, self.timeout)
            .await
            .map_err(|e| match e {
                ReachError::Setup(what) => PromError::Setup(what),
                ReachError::Unreachable(what) => PromError::Unreachable {
                    url: self.url(),
                    what,
                },
            })?;
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(PromError::Refused {
                url: self.url(),
                status,
                hint: self.reach.refused_hint(),
            });
        }
        decode_answer(status, &body).map_err(|what| PromError::Query {
            url: self.url(),
            query: query.to_string(),
            what,
        })
    }

    /// The sum of a query's samples; an empty answer is 0.
    pub async fn scalar(&self, query: &str) -> Result<f64, PromError> {
        Ok(self.query(query).await?.iter().map(|s| s.value).sum())
    }
}

/// Decodes an `/api/v1/query` answer into its samples; only a successful
/// vector answer is accepted. The error says what was wrong with the answer.
pub fn decode_answer(status: StatusCode, body: &[u8]) -> Result<Vec<Sample>, String> {
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
    let data = resp
        .data
        .ok_or_else(|| "no data in the answer".to_string())?;
    if data.result_type != "vector" {
        return Err(format!("expected a vector, got {}", data.result_type));
    }
    data.result
        .into_iter()
        .map(|s| {
            let value = s
                .value
                .1
                .parse::<f64>()
                .map_err(|_| format!("bad sample value {:?}", s.value.1))?;
            Ok(Sample {
                labels: s.metric,
                value,
            })
        })
        .collect()
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
