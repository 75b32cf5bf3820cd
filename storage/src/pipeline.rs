//! Capsules (and, later, configurations and deployment packages) of a project.

use std::sync::Arc;

use crate::{Capsule, Result, Store, Writes, keys};

impl Store {
    pub fn capsule(&self, project: u64, id: u64) -> Result<Option<Capsule>> {
        self.get(&keys::capsule(project, id))
    }

    /// The capsule of that name and version, if any.
    pub fn capsule_by_version(
        &self,
        project: u64,
        name: &str,
        version: &str,
    ) -> Result<Option<Capsule>> {
        match self.get_id(&keys::capsule_by_version(project, name, version))? {
            Some(id) => self.capsule(project, id),
            None => Ok(None),
        }
    }

    /// A project's capsules, newest first (cached; every capsule write updates the cached
    /// list in place rather than dropping it, so a burst of writes never rescans).
    pub fn project_capsules(&self, project: u64) -> Result<Arc<Vec<Arc<Capsule>>>> {
        let c = &self.inner.cache.capsules;
        if let Some(v) = c.get(&project) {
            return Ok(v);
        }
        let g = c.generation();
        let v: Vec<Capsule> = self.scan_rev(&keys::capsule_prefix(project))?;
        let v = Arc::new(v.into_iter().map(Arc::new).collect::<Vec<_>>());
        c.put(g, project, v.clone());
        Ok(v)
    }

    /// Applies a batch of capsule changes; then, when the project's list was cached, stores
    /// the updated list (changed records replaced or added, `deleted` removed).
    fn write_capsules(
        &self,
        project: u64,
        w: Writes,
        changed: &[&Capsule],
        deleted: Option<u64>,
    ) -> Result<()> {
        let c = &self.inner.cache.capsules;
        let before = c.get(&project);
        c.forget(&project);
        self.apply(w.0)?;
        c.forget(&project);
        if let Some(old) = before {
            let g = c.generation();
            let mut list: Vec<Arc<Capsule>> = old
                .iter()
                .filter(|x| Some(x.id) != deleted && !changed.iter().any(|ch| ch.id == x.id))
                .cloned()
                .collect();
            list.extend(changed.iter().map(|ch| Arc::new((*ch).clone())));
            list.sort_by_key(|c| std::cmp::Reverse(c.id));
            c.put(g, project, Arc::new(list));
        }
        Ok(())
    }

    /// Writes capsules (one changed record and any whose `is_latest` moved) in one batch.
    pub fn put_capsules(&self, capsules: &[&Capsule]) -> Result<()> {
        let Some(project) = capsules.first().map(|c| c.project_id) else {
            return Ok(());
        };
        let mut w = Writes::new();
        for c in capsules {
            w.put(keys::capsule(c.project_id, c.id), *c)?;
            w.put_id(
                keys::capsule_by_version(c.project_id, &c.name, &c.version),
                c.id,
            );
        }
        self.write_capsules(project, w, capsules, None)
    }

    /// Deletes a capsule and rewrites the others of its name whose `is_latest` moved.
    pub fn delete_capsule(&self, c: &Capsule, others: &[&Capsule]) -> Result<()> {
        let mut w = Writes::new();
        w.delete(keys::capsule(c.project_id, c.id));
        w.delete(keys::capsule_by_version(c.project_id, &c.name, &c.version));
        for o in others {
            w.put(keys::capsule(o.project_id, o.id), *o)?;
        }
        self.write_capsules(c.project_id, w, others, Some(c.id))
    }
}
