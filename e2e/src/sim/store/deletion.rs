//! Deletion: finalizers and deletionTimestamp, removal, and garbage collection of dependents
//! (background, foreground, orphan), plus what removing a CRD or a namespace implies.

use std::sync::Arc;
use std::time::SystemTime;

use serde_json::Value;

use super::{
    DeleteOptions, EventType, FOREGROUND_FINALIZER, ObjectKey, Propagation, State, Target, is_crd,
    namespaces_key, same_content,
};
use crate::sim::meta::{meta_str, metadata_mut, owner_refs, rfc3339};
use crate::sim::registry::{ResourceInfo, ResourceKey};
use crate::sim::status::{ApiError, ApiResult};

impl State {
    /// Deletes an object: with finalizers (or foreground dependents) it only gets a
    /// deletionTimestamp; otherwise it is removed and its dependents are collected.
    pub fn delete(
        &mut self,
        info: &ResourceInfo,
        namespace: &str,
        name: &str,
        opts: &DeleteOptions,
    ) -> ApiResult<Arc<Value>> {
        let (group, plural) = (info.group.as_str(), info.plural.as_str());
        let key = info.key();
        let namespace = if info.namespaced { namespace } else { "" };
        let old = self
            .get(&key, namespace, name)
            .cloned()
            .ok_or_else(|| ApiError::not_found(group, plural, name))?;
        if key == namespaces_key() && ["default", "kube-system", "kube-public"].contains(&name) {
            return Err(ApiError::forbidden(
                group,
                plural,
                name,
                "this namespace may not be deleted",
            ));
        }
        let uid = meta_str(&old, "uid").to_string();
        if opts.precondition_uid.as_deref().is_some_and(|u| u != uid) {
            return Err(ApiError::conflict(
                group,
                plural,
                name,
                "Precondition failed: UID mismatch",
            ));
        }
        if opts
            .precondition_rv
            .as_deref()
            .is_some_and(|rv| rv != meta_str(&old, "resourceVersion"))
        {
            return Err(ApiError::stale(group, plural, name));
        }
        if opts.propagation == Propagation::Orphan {
            self.orphan_dependents(&uid);
        }
        let mut finalizers: Vec<Value> = old["metadata"]["finalizers"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let foreground =
            opts.propagation == Propagation::Foreground && !self.dependents_of(&uid).is_empty();
        if foreground && !finalizers.iter().any(|f| f == FOREGROUND_FINALIZER) {
            finalizers.push(FOREGROUND_FINALIZER.into());
        }
        let okey = (namespace.to_string(), name.to_string());
        if finalizers.is_empty() {
            return Ok(self.remove(&key, okey, (*old).clone()));
        }
        let mut next = (*old).clone();
        let meta = metadata_mut(&mut next);
        if meta.get("deletionTimestamp").is_none_or(Value::is_null) {
            meta.insert(
                "deletionTimestamp".into(),
                rfc3339(SystemTime::now()).into(),
            );
            meta.insert("deletionGracePeriodSeconds".into(), 0.into());
        }
        meta.insert("finalizers".into(), Value::Array(finalizers));
        let stored = if same_content(&next, &old) {
            old
        } else {
            self.commit(&key, okey, EventType::Modified, next)
        };
        if foreground && !self.dry_run {
            for (dep_key, dep) in self.dependents_of(&uid) {
                self.collect_dependent(&dep_key, &dep, &uid);
            }
            self.finish_foreground(&uid);
        }
        Ok(self.by_uid(&uid).map(|(_, o)| o.clone()).unwrap_or(stored))
    }

    /// Removes an object for good, then runs what removal implies (GC, CRD and namespace cleanup).
    pub(super) fn remove(&mut self, key: &ResourceKey, okey: ObjectKey, last: Value) -> Arc<Value> {
        let removed = self.commit(key, okey.clone(), EventType::Deleted, last);
        if self.dry_run {
            return removed;
        }
        let uid = meta_str(&removed, "uid").to_string();
        if is_crd(key) {
            if let Ok(infos) = crate::sim::registry::crd_resources(&removed) {
                let cr_key = infos[0].key();
                self.delete_all(&cr_key, None);
                self.registry.unregister(&cr_key);
            }
        } else if *key == namespaces_key() {
            for res in self.registry.keys() {
                self.delete_all(&res, Some(&okey.1));
            }
        }
        for (dep_key, dep) in self.dependents_of(&uid) {
            self.collect_dependent(&dep_key, &dep, &uid);
        }
        for owner in owner_refs(&removed) {
            if let Some(owner_uid) = owner["uid"].as_str() {
                self.finish_foreground(owner_uid);
            }
        }
        removed
    }

    /// Deletes every object of a resource (in one namespace or all), honouring finalizers.
    fn delete_all(&mut self, key: &ResourceKey, namespace: Option<&str>) {
        let Some(info) = self.info_for(key) else {
            return;
        };
        let names: Vec<ObjectKey> = self
            .list(key, namespace, None)
            .map(|(k, _)| k.clone())
            .collect();
        for (ns, name) in names {
            // Already gone through garbage collection of an earlier object: nothing to do.
            let _ = self.delete(&info, &ns, &name, &DeleteOptions::default());
        }
    }

    /// A dependent whose owner went away: drop the reference if other owners remain, else delete it.
    fn collect_dependent(&mut self, key: &ResourceKey, dep: &Value, owner_uid: &str) {
        let Some(info) = self.info_for(key) else {
            return;
        };
        let (ns, name) = (
            meta_str(dep, "namespace").to_string(),
            meta_str(dep, "name").to_string(),
        );
        let owners_left = owner_refs(dep).iter().any(|r| {
            r["uid"]
                .as_str()
                .is_some_and(|u| u != owner_uid && self.by_uid.contains_key(u))
        });
        if owners_left {
            let mut next = dep.clone();
            if let Some(refs) = next["metadata"]["ownerReferences"].as_array_mut() {
                refs.retain(|r| r["uid"].as_str() != Some(owner_uid));
            }
            let _ = self.update(&info, &ns, &name, next, Target::Main);
        } else if dep["metadata"]
            .get("deletionTimestamp")
            .is_none_or(Value::is_null)
        {
            // A dependent deleted concurrently is already on its way out.
            let _ = self.delete(&info, &ns, &name, &DeleteOptions::default());
        }
    }

    /// Removes the foreground finalizer of a deleting owner once it has no dependents left.
    fn finish_foreground(&mut self, owner_uid: &str) {
        let Some((key, owner)) = self.by_uid(owner_uid).map(|(k, o)| (k.clone(), o.clone())) else {
            return;
        };
        let waiting = owner["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| f.iter().any(|x| x == FOREGROUND_FINALIZER));
        if !waiting || !self.dependents_of(owner_uid).is_empty() {
            return;
        }
        let Some(info) = self.info_for(&key) else {
            return;
        };
        let mut next = (*owner).clone();
        if let Some(f) = next["metadata"]["finalizers"].as_array_mut() {
            f.retain(|x| x != FOREGROUND_FINALIZER);
        }
        let _ = self.update(
            &info,
            meta_str(&owner, "namespace"),
            meta_str(&owner, "name"),
            next,
            Target::Main,
        );
    }

    fn orphan_dependents(&mut self, owner_uid: &str) {
        for (key, dep) in self.dependents_of(owner_uid) {
            let Some(info) = self.info_for(&key) else {
                continue;
            };
            let mut next = (*dep).clone();
            if let Some(refs) = next["metadata"]["ownerReferences"].as_array_mut() {
                refs.retain(|r| r["uid"].as_str() != Some(owner_uid));
            }
            let _ = self.update(
                &info,
                meta_str(&dep, "namespace"),
                meta_str(&dep, "name"),
                next,
                Target::Main,
            );
        }
    }
}
