//! Label and field selectors. (Interface fixed; bodies being written.)

use serde_json::{Map, Value};

/// A parsed label selector (`a=b,c!=d,e in (f,g),h notin (i),j,!k`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector {
    requirements: Vec<(String, String)>,
}

impl LabelSelector {
    /// Parses the query-string form.
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut requirements = Vec::new();
        for part in s.split(',').filter(|p| !p.trim().is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("unsupported selector {part:?}"))?;
            requirements.push((
                k.trim().to_string(),
                v.trim_start_matches('=').trim().to_string(),
            ));
        }
        Ok(Self { requirements })
    }

    /// The selector from a structured `{matchLabels, matchExpressions}` object.
    pub fn from_json(selector: &Value) -> Result<Self, String> {
        let mut requirements = Vec::new();
        if let Some(m) = selector.get("matchLabels").and_then(Value::as_object) {
            for (k, v) in m {
                requirements.push((k.clone(), v.as_str().unwrap_or_default().to_string()));
            }
        }
        Ok(Self { requirements })
    }

    /// Whether an object with these labels is selected.
    pub fn matches(&self, labels: Option<&Map<String, Value>>) -> bool {
        self.requirements
            .iter()
            .all(|(k, v)| labels.and_then(|l| l.get(k)).and_then(Value::as_str) == Some(v.as_str()))
    }
}

/// A parsed field selector (`metadata.name=x,metadata.namespace!=y`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector {
    requirements: Vec<(String, String)>,
}

impl FieldSelector {
    pub fn parse(s: &str) -> Result<Self, String> {
        LabelSelector::parse(s).map(|l| Self {
            requirements: l.requirements,
        })
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.requirements.iter().all(|(path, v)| {
            let mut cur = obj;
            for seg in path.split('.') {
                cur = cur.get(seg).unwrap_or(&Value::Null);
            }
            cur.as_str() == Some(v.as_str())
        })
    }
}
