//! Decoding watched objects one at a time, so one object that does not fit our types (an int32
//! field set to 3000000000, a free-form field nested deeper than serde_json's limit of 128)
//! cannot make a whole LIST or watch fail and leave every other object unreconciled.
//!
//! [`Decoded<K>`] is what the watches list and watch instead of `K`. It takes each object as
//! raw JSON text (`serde_json`'s `RawValue`, which skips nested values without recursing, so an
//! object's depth never counts against the list it is in) and decodes it into `K` on its own.
//! An object that does not decode becomes an [`Undecodable`]: its metadata, the error with the
//! field's path, and its raw status, which is all a report needs. The watches then hand only the
//! typed objects to their stores ([`Sorter`]), log each undecodable object once per generation
//! and error, and report it ([`spawn_reporter`]): a Warning event on the object and, where the
//! kind has a status of ours, a status write (`InvalidSpec` on a Rollout, the `Error` phase on an
//! AnalysisRun) through a merge patch that needs no typed object.
//!
//! `metadata.managedFields` mirrors an object's shape, so a deep object has deep managed fields;
//! no one here reads them, so an object that fails with them is decoded again without them.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::{self, Debug};
use std::marker::PhantomData;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::Reporter;
use kube::runtime::watcher;
use kube::{Client, Resource};
use rollouts_crds::FieldError;
use rollouts_crds::analysis::{AnalysisRun, AnalysisRunSpec};
use rollouts_crds::conditions;
use rollouts_crds::rollout::{Rollout, RolloutSpec, RolloutStatus};
use serde::Deserialize;
use serde::de::{DeserializeOwned, Deserializer};
use serde_json::Value;
use serde_json::value::RawValue;
use tokio::sync::mpsc;

use crate::context::CONTROLLER_NAME;
use crate::status_patch;

/// How many undecodable objects wait for their report at most; more are logged, and reported
/// when they change again.
const REPORT_QUEUE: usize = 256;

/// How many segments of a field path an error names before it elides the rest.
const PATH_SEGMENTS_SHOWN: usize = 12;

/// How deep serde_json decodes, counted from the object's root.
pub const DECODE_DEPTH_LIMIT: usize = 128;

/// An object as a watch lists it: decoded into `K`, or the reason it could not be.
#[derive(Clone, Debug)]
pub enum Decoded<K> {
    Typed(K),
    Undecodable(Box<Undecodable>),
}

/// What is known of an object that does not decode into its type.
#[derive(Clone, Debug)]
pub struct Undecodable {
    /// The object's metadata (without managedFields); empty fields where even that failed.
    pub metadata: ObjectMeta,
    pub error: DecodeError,
    /// The object's `status`, as it came, for a report that keeps what it does not change.
    pub status: Option<Box<RawValue>>,
}

/// Why an object does not decode: the field, and serde's reason without the text position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeError {
    /// The field's JSON path (`spec.replicas`), elided after a dozen segments.
    pub path: String,
    /// How many segments the full path has.
    pub depth: usize,
    pub reason: String,
}

impl DecodeError {
    /// Locates `error` (from decoding `text`) in `text`.
    fn locate(text: &str, error: &serde_json::Error) -> Self {
        let offset = offset_of(text, error.line(), error.column());
        let segments = path_at(text, offset);
        let depth = segments.len();
        let full = error.to_string();
        let position = format!(" at line {} column {}", error.line(), error.column());
        let reason = full
            .strip_suffix(&position)
            .map(str::to_string)
            .unwrap_or(full);
        let reason = if reason.contains("recursion limit exceeded") {
            format!(
                "nested more than {DECODE_DEPTH_LIMIT} levels deep (counted from the object's root, {depth} here), deeper than the controller decodes"
            )
        } else {
            reason
        };
        Self {
            path: format_path(&segments),
            depth,
            reason,
        }
    }

    /// What to do about it.
    pub fn fix(&self) -> &'static str {
        if self.reason.contains("levels deep") {
            "nest the value less deeply"
        } else if self.reason.contains("expected i32") || self.reason.contains("32-bit integer") {
            "use a whole number from -2147483648 to 2147483647"
        } else if self.reason.contains("expected i64") {
            "use a whole number from -9223372036854775808 to 9223372036854775807"
        } else if self.reason.contains("expected u")
            || self.reason.contains("expected i")
            || self.reason.contains("expected f")
        {
            "use a number in the range of the field's type (kubectl explain shows it)"
        } else {
            "give the field a value of the type the CRD documents (kubectl explain shows it)"
        }
    }

    /// The error as a spec finding, for the `InvalidSpec` condition.
    pub fn finding(&self) -> FieldError {
        FieldError::new(
            self.path.clone(),
            format!("cannot be decoded: {}", self.reason),
            self.fix(),
        )
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} (fix: {})", self.path, self.reason, self.fix())
    }
}

impl<K: DeserializeOwned> Decoded<K> {
    /// Decodes one object from its JSON text; never fails.
    pub fn from_json(text: &str) -> Self {
        let first = match serde_json::from_str::<K>(text) {
            Ok(object) => return Self::Typed(object),
            Err(error) => error,
        };
        let Ok(mut top) = serde_json::from_str::<BTreeMap<String, Box<RawValue>>>(text) else {
            return Self::Undecodable(Box::new(Undecodable {
                metadata: ObjectMeta::default(),
                error: DecodeError::locate(text, &first),
                status: None,
            }));
        };
        let mut metadata: BTreeMap<String, Box<RawValue>> = top
            .get("metadata")
            .and_then(|raw| serde_json::from_str(raw.get()).ok())
            .unwrap_or_default();
        let mut tried = Cow::Borrowed(text);
        let mut error = first;
        if metadata.remove("managedFields").is_some()
            && let Ok(raw) = serde_json::value::to_raw_value(&metadata)
        {
            top.insert("metadata".to_string(), raw);
            if let Ok(rebuilt) = serde_json::to_string(&top) {
                match serde_json::from_str::<K>(&rebuilt) {
                    Ok(object) => return Self::Typed(object),
                    Err(again) => {
                        error = again;
                        tried = Cow::Owned(rebuilt);
                    }
                }
            }
        }
        Self::Undecodable(Box::new(Undecodable {
            metadata: metadata_of(&metadata),
            error: DecodeError::locate(&tried, &error),
            status: top.remove("status"),
        }))
    }
}

impl<'de, K: DeserializeOwned> Deserialize<'de> for Decoded<K> {
    /// Only from JSON text (how kube's client decodes lists, watch events and responses): the
    /// object is taken raw first, so a failure inside it stays inside it.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = <Box<RawValue>>::deserialize(deserializer)?;
        Ok(Self::from_json(raw.get()))
    }
}

impl<K: Resource> Resource for Decoded<K> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(dt)
    }

    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::group(dt)
    }

    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::version(dt)
    }

    fn api_version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::api_version(dt)
    }

    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(dt)
    }

    fn url_path(dt: &Self::DynamicType, namespace: Option<&str>) -> String {
        K::url_path(dt, namespace)
    }

    fn meta(&self) -> &ObjectMeta {
        match self {
            Self::Typed(object) => object.meta(),
            Self::Undecodable(undecodable) => &undecodable.metadata,
        }
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Self::Typed(object) => object.meta_mut(),
            Self::Undecodable(undecodable) => &mut undecodable.metadata,
        }
    }
}

/// The metadata of an undecodable object: all of it when it decodes, else the fields that do.
fn metadata_of(fields: &BTreeMap<String, Box<RawValue>>) -> ObjectMeta {
    if let Ok(text) = serde_json::to_string(fields)
        && let Ok(metadata) = serde_json::from_str::<ObjectMeta>(&text)
    {
        return metadata;
    }
    let field = |name: &str| -> Option<String> {
        fields
            .get(name)
            .and_then(|raw| serde_json::from_str(raw.get()).ok())
    };
    ObjectMeta {
        name: field("name"),
        namespace: field("namespace"),
        uid: field("uid"),
        resource_version: field("resourceVersion"),
        generation: fields
            .get("generation")
            .and_then(|raw| serde_json::from_str(raw.get()).ok()),
        ..ObjectMeta::default()
    }
}

/// The byte offset of serde_json's (1-based) line and column in `text`.
fn offset_of(text: &str, line: usize, column: usize) -> usize {
    let line_start = text
        .match_indices('\n')
        .nth(line.saturating_sub(2))
        .filter(|_| line > 1)
        .map_or(0, |(index, _)| index.saturating_add(1));
    line_start.saturating_add(column).min(text.len())
}

enum Frame {
    Object(Option<String>),
    Array(usize),
}

/// The path of the value at `offset` in the JSON `text`, by one pass over it without recursion.
fn path_at(text: &str, offset: usize) -> Vec<String> {
    let bytes = text.as_bytes();
    let end = offset.min(bytes.len());
    let mut frames: Vec<Frame> = Vec::new();
    let mut expecting_key = false;
    let mut index = 0;
    while index < end {
        let Some(&byte) = bytes.get(index) else {
            break;
        };
        match byte {
            b'{' => {
                frames.push(Frame::Object(None));
                expecting_key = true;
            }
            b'[' => {
                frames.push(Frame::Array(0));
                expecting_key = false;
            }
            b'}' | b']' => {
                frames.pop();
                expecting_key = false;
            }
            b',' => match frames.last_mut() {
                Some(Frame::Object(key)) => {
                    *key = None;
                    expecting_key = true;
                }
                Some(Frame::Array(position)) => *position = position.saturating_add(1),
                None => {}
            },
            b'"' => {
                let start = index.saturating_add(1);
                index = string_end(bytes, start);
                if expecting_key {
                    if let Some(Frame::Object(key)) = frames.last_mut() {
                        *key = Some(text.get(start..index).unwrap_or_default().to_string());
                    }
                    expecting_key = false;
                }
            }
            _ => {}
        }
        index = index.saturating_add(1);
    }
    frames
        .into_iter()
        .filter_map(|frame| match frame {
            Frame::Object(key) => key,
            Frame::Array(position) => Some(format!("[{position}]")),
        })
        .collect()
}

/// The index of the quote that closes the string starting at `start` (or the end of `bytes`).
fn string_end(bytes: &[u8], start: usize) -> usize {
    let mut index = start;
    while let Some(&byte) = bytes.get(index) {
        match byte {
            b'\\' => index = index.saturating_add(2),
            b'"' => return index,
            _ => index = index.saturating_add(1),
        }
    }
    bytes.len()
}

/// `spec.template.metadata.annotations["example.com/a"]`, elided after a dozen segments.
fn format_path(segments: &[String]) -> String {
    let mut path = String::new();
    for segment in segments.iter().take(PATH_SEGMENTS_SHOWN) {
        if segment.starts_with('[') {
            path.push_str(segment);
        } else if segment
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            if !path.is_empty() {
                path.push('.');
            }
            path.push_str(segment);
        } else {
            path.push_str(&format!("[{segment:?}]"));
        }
    }
    if segments.len() > PATH_SEGMENTS_SHOWN {
        path.push_str(&format!(
            "... ({} more levels)",
            segments.len().saturating_sub(PATH_SEGMENTS_SHOWN)
        ));
    }
    if path.is_empty() {
        path.push_str("(the object)");
    }
    path
}

/// A kind whose undecodable objects are reported: how to stand one in for a deleted object, and
/// what its report writes.
pub trait Report:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + DeserializeOwned
    + Clone
    + Debug
    + Send
    + Sync
    + 'static
{
    /// An object with only `metadata`, enough for a store to drop the object it names.
    fn from_metadata(metadata: ObjectMeta) -> Self;

    /// The reason of the Warning event.
    fn event_reason() -> &'static str {
        conditions::INVALID_SPEC_REASON
    }

    /// What the report writes to `/status`.
    fn status_report(_undecodable: &Undecodable, _now: Timestamp) -> StatusReport {
        StatusReport::NoStatus
    }
}

/// What a report writes to the status of an undecodable object.
#[derive(Clone, Debug, PartialEq)]
pub enum StatusReport {
    /// The kind's status is not ours to write: the event alone reports it.
    NoStatus,
    /// Status already says so: nothing is written, and no event repeats it.
    Recorded,
    /// This merge patch (`{"status": ...}`), then the event.
    Patch(Value),
}

impl Report for Rollout {
    fn from_metadata(metadata: ObjectMeta) -> Self {
        Rollout {
            metadata,
            spec: RolloutSpec::default(),
            status: None,
        }
    }

    /// The `InvalidSpec` condition naming the field (kept with its times while unchanged),
    /// `observedGeneration` and Argo's Degraded phase, as for any invalid spec.
    fn status_report(undecodable: &Undecodable, now: Timestamp) -> StatusReport {
        let status = undecodable
            .status
            .as_ref()
            .and_then(|raw| serde_json::from_str::<RolloutStatus>(raw.get()).ok());
        let rollout = Rollout {
            status,
            ..Self::from_metadata(undecodable.metadata.clone())
        };
        let desired =
            status_patch::invalid_spec_status(&rollout, &[undecodable.error.finding()], now);
        match status_patch::status_patch(&rollout, &desired) {
            Ok(Some(patch)) => StatusReport::Patch(patch),
            Ok(None) => StatusReport::Recorded,
            // RolloutStatus always encodes; without a patch the event still reports it.
            Err(_) => StatusReport::NoStatus,
        }
    }
}

/// The phases after which a run is never measured or written again.
const FINISHED_RUN_PHASES: [&str; 4] = ["Successful", "Failed", "Error", "Inconclusive"];

#[derive(Deserialize)]
struct RunPhase {
    #[serde(default)]
    phase: String,
    #[serde(default)]
    message: String,
}

impl Report for AnalysisRun {
    fn from_metadata(metadata: ObjectMeta) -> Self {
        AnalysisRun {
            metadata,
            spec: AnalysisRunSpec::default(),
            status: None,
        }
    }

    /// The `Error` phase with a message naming the field, unless the run finished before:
    /// its result stands.
    fn status_report(undecodable: &Undecodable, _now: Timestamp) -> StatusReport {
        let current = undecodable
            .status
            .as_ref()
            .and_then(|raw| serde_json::from_str::<RunPhase>(raw.get()).ok());
        let message = format!("The AnalysisRun cannot be decoded: {}", undecodable.error);
        match current {
            Some(current) if current.phase == "Error" && current.message == message => {
                StatusReport::Recorded
            }
            Some(current) if FINISHED_RUN_PHASES.contains(&current.phase.as_str()) => {
                StatusReport::NoStatus
            }
            _ => StatusReport::Patch(serde_json::json!({
                "status": {"phase": "Error", "message": message}
            })),
        }
    }
}

impl Report for ReplicaSet {
    fn from_metadata(metadata: ObjectMeta) -> Self {
        ReplicaSet {
            metadata,
            ..ReplicaSet::default()
        }
    }

    fn event_reason() -> &'static str {
        "DecodeFailed"
    }
}

/// Splits a watch of [`Decoded`] objects into the typed events a store takes, and notes each
/// undecodable object: logged once per generation and error, and sent to its reporter.
///
/// An object that turns undecodable leaves the store (as a delete), so nothing acts on its
/// last decodable version; it comes back when it decodes again.
pub struct Sorter<K> {
    notes: Notes,
    _kind: PhantomData<fn() -> K>,
}

impl<K: Report> Sorter<K> {
    /// `reports`: where undecodable objects go to be reported (`None`: logged only).
    pub fn new(reports: Option<mpsc::Sender<Box<Undecodable>>>) -> Self {
        Self {
            notes: Notes::new(K::kind(&()).into_owned(), reports),
            _kind: PhantomData,
        }
    }

    pub fn sort(&mut self, event: watcher::Event<Decoded<K>>) -> Option<watcher::Event<K>> {
        self.notes.observe_event(&event);
        match event {
            watcher::Event::Init => Some(watcher::Event::Init),
            watcher::Event::InitDone => Some(watcher::Event::InitDone),
            watcher::Event::InitApply(Decoded::Typed(object)) => {
                Some(watcher::Event::InitApply(object))
            }
            watcher::Event::InitApply(Decoded::Undecodable(_)) => None,
            watcher::Event::Apply(Decoded::Typed(object)) => Some(watcher::Event::Apply(object)),
            watcher::Event::Apply(Decoded::Undecodable(undecodable))
            | watcher::Event::Delete(Decoded::Undecodable(undecodable)) => Some(
                watcher::Event::Delete(K::from_metadata(undecodable.metadata)),
            ),
            watcher::Event::Delete(Decoded::Typed(object)) => Some(watcher::Event::Delete(object)),
        }
    }
}

/// Which undecodable objects were logged and reported, so each is once per generation and
/// error, not once per relist or per status write.
pub struct Notes {
    kind: String,
    reports: Option<mpsc::Sender<Box<Undecodable>>>,
    /// `namespace/name` -> the generation and error last noted.
    noted: HashMap<String, (Option<i64>, DecodeError)>,
    /// Keys of the undecodable objects seen since the relist began.
    relisted: Option<HashSet<String>>,
}

impl Notes {
    pub fn new(kind: String, reports: Option<mpsc::Sender<Box<Undecodable>>>) -> Self {
        Self {
            kind,
            reports,
            noted: HashMap::new(),
            relisted: None,
        }
    }

    /// Notes the undecodable object in `event`, forgets objects deleted or decodable again.
    pub fn observe_event<K: Resource>(&mut self, event: &watcher::Event<Decoded<K>>) {
        match event {
            watcher::Event::Init => self.relisted = Some(HashSet::new()),
            watcher::Event::InitDone => {
                if let Some(relisted) = self.relisted.take() {
                    self.noted.retain(|key, _| relisted.contains(key));
                }
            }
            watcher::Event::InitApply(object) | watcher::Event::Apply(object) => match object {
                Decoded::Typed(object) => {
                    self.noted.remove(&key_of(object.meta()));
                }
                Decoded::Undecodable(undecodable) => self.note(undecodable),
            },
            watcher::Event::Delete(object) => {
                self.noted.remove(&key_of(object.meta()));
            }
        }
    }

    fn note(&mut self, undecodable: &Undecodable) {
        let key = key_of(&undecodable.metadata);
        if let Some(relisted) = self.relisted.as_mut() {
            relisted.insert(key.clone());
        }
        let noted = (undecodable.metadata.generation, undecodable.error.clone());
        if self.noted.get(&key) == Some(&noted) {
            return;
        }
        tracing::warn!(
            kind = %self.kind,
            object = %key,
            resource_version = undecodable.metadata.resource_version.as_deref().unwrap_or_default(),
            error = %undecodable.error,
            "cannot decode the object; it is not acted on until it is fixed"
        );
        self.noted.insert(key.clone(), noted);
        let Some(reports) = &self.reports else {
            return;
        };
        match reports.try_send(Box::new(undecodable.clone())) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                tracing::warn!(kind = %self.kind, object = %key, "too many undecodable objects waiting to be reported; this one is reported when it is seen again");
                // Not noted: the next relist or change tries again.
                self.noted.remove(&key);
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                tracing::error!(kind = %self.kind, object = %key, "the task reporting undecodable objects has stopped; this one is logged only");
            }
        }
    }
}

fn key_of(metadata: &ObjectMeta) -> String {
    format!(
        "{}/{}",
        metadata.namespace.as_deref().unwrap_or_default(),
        metadata.name.as_deref().unwrap_or_default()
    )
}

/// Starts the task that reports undecodable objects of kind `K` sent to the returned sender:
/// a status write where [`Report::status_report`] asks for one, then a Warning event. It ends
/// when every sender is dropped.
pub fn spawn_reporter<K: Report>(client: Client) -> mpsc::Sender<Box<Undecodable>> {
    let (sender, mut receiver) = mpsc::channel::<Box<Undecodable>>(REPORT_QUEUE);
    let reporter = Reporter {
        controller: CONTROLLER_NAME.to_string(),
        instance: std::env::var("POD_NAME").ok(),
    };
    tokio::spawn(async move {
        while let Some(undecodable) = receiver.recv().await {
            report::<K>(&client, &reporter, &undecodable).await;
        }
    });
    sender
}

async fn report<K: Report>(client: &Client, reporter: &Reporter, undecodable: &Undecodable) {
    let kind = K::kind(&());
    let (Some(namespace), Some(name)) = (
        undecodable.metadata.namespace.as_deref(),
        undecodable.metadata.name.as_deref(),
    ) else {
        return;
    };
    match K::status_report(undecodable, Timestamp::now()) {
        StatusReport::Recorded => return,
        StatusReport::NoStatus => {}
        StatusReport::Patch(patch) => {
            // Decoded, so the response of a patch to an undecodable object decodes too.
            let api: Api<Decoded<K>> = Api::namespaced(client.clone(), namespace);
            match api
                .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => return,
                Err(error) => tracing::warn!(
                    %kind, %namespace, %name, %error,
                    "cannot write the status of an undecodable object; it is tried again when the object changes"
                ),
            }
        }
    }
    // Once per version of the object: the same undecodable copy seen again (a relist) finds
    // its event already there.
    let note = format!(
        "The {kind} \"{name}\" cannot be decoded: {}",
        undecodable.error
    );
    let once = crate::events::Once {
        regarding: K::from_metadata(undecodable.metadata.clone()).object_ref(&()),
        decided_at: undecodable
            .metadata
            .resource_version
            .as_deref()
            .unwrap_or_default(),
        warning: true,
        reason: K::event_reason(),
        note: &note,
        action: "Decode",
    };
    if let Err(error) = crate::events::send(client, reporter, &once).await {
        tracing::warn!(%kind, %namespace, %name, %error, "event not published");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn nested(depth: usize) -> Value {
        let mut value = json!("bottom");
        for _ in 0..depth {
            value = json!({ "a": value });
        }
        value
    }

    fn rollout(spec: Value) -> String {
        json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Rollout",
            "metadata": {"name": "web", "namespace": "default", "generation": 2, "resourceVersion": "7"},
            "spec": spec,
        })
        .to_string()
    }

    fn undecodable(decoded: Decoded<Rollout>) -> Undecodable {
        match decoded {
            Decoded::Typed(rollout) => panic!("decoded {rollout:?}"),
            Decoded::Undecodable(undecodable) => *undecodable,
        }
    }

    #[test]
    fn a_decodable_object_is_typed() {
        let decoded = Decoded::<Rollout>::from_json(&rollout(json!({"replicas": 3})));
        let Decoded::Typed(rollout) = decoded else {
            panic!("not typed: {decoded:?}");
        };
        assert_eq!(rollout.spec.replicas, Some(3));
    }

    #[test]
    fn an_int32_overflow_names_the_field_and_the_range() {
        let bad = undecodable(Decoded::from_json(&rollout(
            json!({"strategy": {"canary": {}}, "replicas": 3_000_000_000u64}),
        )));
        assert_eq!(bad.error.path, "spec.replicas");
        assert!(bad.error.reason.contains("3000000000"), "{}", bad.error);
        assert!(!bad.error.reason.contains("column"), "{}", bad.error);
        assert_eq!(
            bad.error.fix(),
            "use a whole number from -2147483648 to 2147483647"
        );
        assert_eq!(bad.metadata.name.as_deref(), Some("web"));
        assert_eq!(bad.metadata.generation, Some(2));
    }

    #[test]
    fn a_field_in_pretty_printed_json_is_found_by_line_and_column() {
        let text = serde_json::to_string_pretty(&json!({
            "metadata": {"name": "web", "annotations": {"example.com/a": "b"}},
            "spec": {"strategy": {"canary": {"steps": [{"setWeight": 3_000_000_000u64}]}}},
        }))
        .expect("encodes");
        let bad = undecodable(Decoded::from_json(&text));
        assert_eq!(bad.error.path, "spec.strategy.canary.steps[0].setWeight");
    }

    #[test]
    fn keys_that_are_not_identifiers_are_quoted() {
        let segments = path_at(r#"{"metadata":{"annotations":{"example.com/a":1"#, 44);
        assert_eq!(
            format_path(&segments),
            r#"metadata.annotations["example.com/a"]"#
        );
    }

    #[test]
    fn a_field_inside_an_array_is_named_with_its_index() {
        let bad = undecodable(Decoded::from_json(&rollout(json!({
            "strategy": {"canary": {"steps": [{"setWeight": 10}, {"setWeight": 3_000_000_000u64}]}}
        }))));
        assert_eq!(bad.error.path, "spec.strategy.canary.steps[1].setWeight");
    }

    #[test]
    fn a_free_form_field_nested_too_deep_is_reported_not_overflowed() {
        let spec = json!({"template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "app", "image": "app:v1", "x": nested(140)}]}}});
        let bad = undecodable(Decoded::from_json(&rollout(spec)));
        assert!(
            bad.error
                .path
                .starts_with("spec.template.spec.containers[0].x.a.a"),
            "{}",
            bad.error.path
        );
        assert!(bad.error.path.contains("more levels"), "{}", bad.error.path);
        assert!(
            bad.error.reason.contains("128 levels deep"),
            "{}",
            bad.error
        );
        assert_eq!(bad.error.fix(), "nest the value less deeply");
    }

    #[test]
    fn deep_managed_fields_are_dropped_not_fatal() {
        let text = json!({
            "metadata": {"name": "web", "namespace": "default",
                "managedFields": [{"manager": "kubectl", "fieldsV1": nested(140)}]},
            "spec": {"replicas": 2},
        })
        .to_string();
        let Decoded::Typed(rollout) = Decoded::<Rollout>::from_json(&text) else {
            panic!("deep managed fields made the Rollout undecodable");
        };
        assert_eq!(rollout.spec.replicas, Some(2));
        assert_eq!(rollout.metadata.managed_fields, None);
    }

    #[test]
    fn a_list_with_one_bad_and_one_deep_item_decodes_the_rest() {
        let list = format!(
            r#"{{"apiVersion":"v1","kind":"List","metadata":{{"resourceVersion":"9"}},"items":[{},{},{}]}}"#,
            rollout(json!({"replicas": 3_000_000_000u64})),
            rollout(json!({"template": {"spec": {"x": nested(200)}}})),
            rollout(json!({"replicas": 1})),
        );
        let list: kube::core::ObjectList<Decoded<Rollout>> =
            serde_json::from_str(&list).expect("the list decodes");
        let typed = list
            .items
            .iter()
            .filter(|item| matches!(item, Decoded::Typed(_)))
            .count();
        assert_eq!((list.items.len(), typed), (3, 1));
    }

    #[test]
    fn a_watch_event_with_a_deep_object_decodes() {
        let line = format!(
            r#"{{"type":"MODIFIED","object":{}}}"#,
            rollout(json!({"template": {"spec": {"x": nested(300)}}}))
        );
        let event: kube::core::WatchEvent<Decoded<Rollout>> =
            serde_json::from_str(&line).expect("the event decodes");
        let kube::core::WatchEvent::Modified(Decoded::Undecodable(bad)) = event else {
            panic!("not an undecodable Modified event");
        };
        assert_eq!(bad.metadata.name.as_deref(), Some("web"));
    }

    #[test]
    fn the_rollout_report_is_the_invalid_spec_condition_then_nothing() {
        let bad = undecodable(Decoded::from_json(&rollout(
            json!({"replicas": 3_000_000_000u64}),
        )));
        let now = Timestamp::now();
        let StatusReport::Patch(patch) = Rollout::status_report(&bad, now) else {
            panic!("no status patch");
        };
        let condition = &patch["status"]["conditions"][0];
        assert_eq!(condition["type"], "InvalidSpec");
        let message = condition["message"].as_str().unwrap_or_default();
        assert!(message.contains("spec.replicas"), "{message}");
        assert_eq!(patch["status"]["observedGeneration"], "2");
        assert_eq!(patch["status"]["phase"], "Degraded");

        // The object as the API has it after the patch: reported already.
        let mut written = Undecodable {
            status: Some(
                serde_json::value::to_raw_value(&patch["status"]).expect("encodes the status"),
            ),
            ..bad
        };
        assert_eq!(
            Rollout::status_report(&written, now),
            StatusReport::Recorded
        );
        written.metadata.generation = Some(3);
        assert!(matches!(
            Rollout::status_report(&written, now),
            StatusReport::Patch(_)
        ));
    }

    #[test]
    fn the_run_report_is_the_error_phase_unless_it_finished() {
        let text = |status: Value| {
            json!({
                "metadata": {"name": "run", "namespace": "default"},
                "spec": {"metrics": [{"name": "m", "count": 3_000_000_000u64, "provider": {"web": {"url": "http://x"}}}]},
                "status": status,
            })
            .to_string()
        };
        let bad = |status: Value| match Decoded::<AnalysisRun>::from_json(&text(status)) {
            Decoded::Typed(run) => panic!("decoded {run:?}"),
            Decoded::Undecodable(undecodable) => *undecodable,
        };
        let running = bad(json!({"phase": "Running"}));
        let StatusReport::Patch(patch) = AnalysisRun::status_report(&running, Timestamp::now())
        else {
            panic!("no status patch");
        };
        assert_eq!(patch["status"]["phase"], "Error");
        let message = patch["status"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("spec.metrics[0].count"), "{message}");
        assert_eq!(
            AnalysisRun::status_report(&bad(patch["status"].clone()), Timestamp::now()),
            StatusReport::Recorded
        );
        assert_eq!(
            AnalysisRun::status_report(&bad(json!({"phase": "Successful"})), Timestamp::now()),
            StatusReport::NoStatus
        );
    }

    #[test]
    fn the_sorter_keeps_undecodable_objects_out_and_notes_each_once() {
        let (sender, mut receiver) = mpsc::channel(8);
        let mut sorter = Sorter::<Rollout>::new(Some(sender));
        let bad = || Decoded::<Rollout>::from_json(&rollout(json!({"replicas": 3_000_000_000u64})));
        let good = || Decoded::<Rollout>::from_json(&rollout(json!({"replicas": 1})));

        assert!(matches!(
            sorter.sort(watcher::Event::Init),
            Some(watcher::Event::Init)
        ));
        assert!(sorter.sort(watcher::Event::InitApply(bad())).is_none());
        assert!(matches!(
            sorter.sort(watcher::Event::InitDone),
            Some(watcher::Event::InitDone)
        ));
        // The same object again (a relist, a status write): not noted again.
        sorter.sort(watcher::Event::Init);
        sorter.sort(watcher::Event::InitApply(bad()));
        sorter.sort(watcher::Event::InitDone);
        let Some(watcher::Event::Delete(stub)) = sorter.sort(watcher::Event::Apply(bad())) else {
            panic!("an undecodable update is not a delete for the store");
        };
        assert_eq!(stub.metadata.name.as_deref(), Some("web"));
        assert!(receiver.try_recv().is_ok(), "noted once");
        assert!(receiver.try_recv().is_err(), "and only once");

        // Fixed, then broken again: noted again.
        assert!(matches!(
            sorter.sort(watcher::Event::Apply(good())),
            Some(watcher::Event::Apply(_))
        ));
        sorter.sort(watcher::Event::Apply(bad()));
        assert!(receiver.try_recv().is_ok(), "noted after it was fixed");
    }
}
