//! The request log: every request served, kept in memory and optionally appended to a file as
//! JSON lines (RBAC tests derive the least privileges a client needs from it).

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

use serde::Serialize;

/// One served request, in the terms RBAC uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RequestRecord {
    /// get, list, watch, create, update, patch, delete, deletecollection (lower-case HTTP method
    /// for non-resource paths).
    pub verb: String,
    pub group: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    /// Set for non-resource requests such as `/version` or `/apis`.
    pub path: String,
    pub user_agent: String,
    /// HTTP status code of the response.
    pub code: u16,
}

#[derive(Default)]
pub struct RequestLog {
    records: Mutex<Vec<RequestRecord>>,
    file: Mutex<Option<File>>,
}

impl RequestLog {
    pub fn new(file: Option<&Path>) -> std::io::Result<Self> {
        let file = match file {
            Some(path) => Some(File::options().create(true).append(true).open(path)?),
            None => None,
        };
        Ok(Self {
            records: Mutex::new(Vec::new()),
            file: Mutex::new(file),
        })
    }

    pub fn record(&self, record: RequestRecord) {
        if let Some(file) = self.file.lock().unwrap_or_else(|p| p.into_inner()).as_mut()
            && let Ok(mut line) = serde_json::to_vec(&record)
        {
            line.push(b'\n');
            // A full disk must not take the API server down; the in-memory log still has it.
            let _ = file.write_all(&line);
        }
        self.records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(record);
    }

    pub fn snapshot(&self) -> Vec<RequestRecord> {
        self.records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The requests served after the first `from` (all of them when the log was cleared since),
    /// so a poller copies only what is new.
    pub fn since(&self, from: usize) -> Vec<RequestRecord> {
        let records = self.records.lock().unwrap_or_else(|p| p.into_inner());
        records.get(from..).unwrap_or(&records[..]).to_vec()
    }

    pub fn len(&self) -> usize {
        self.records.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn clear(&self) {
        self.records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }
}
