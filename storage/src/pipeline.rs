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

    /// A project's capsules, newest first (cached; every capsule write refreshes it).
    pub fn project_capsules(&self, project: u64) -> Result<Arc<Vec<Capsule>>> {
        let c = &self.inner.cache.capsules;
        let g = c.generation();
        if let Some(v) = c.get(&project) {
            return Ok(v.clone());
        }
        let v = Arc::new(self.scan_rev(&keys::capsule_prefix(project))?);
        c.put(g, project, v.clone());
        Ok(v)
    }

    fn write_capsules(&self, project: u64, w: Writes) -> Result<()> {
        self.inner.cache.capsules.forget(&project);
        self.apply(w.0)?;
        self.inner.cache.capsules.forget(&project);
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
        self.write_capsules(project, w)
    }

    /// Deletes a capsule and rewrites the others of its name whose `is_latest` moved.
    pub fn delete_capsule(&self, c: &Capsule, others: &[&Capsule]) -> Result<()> {
        let mut w = Writes::new();
        w.delete(keys::capsule(c.project_id, c.id));
        w.delete(keys::capsule_by_version(c.project_id, &c.name, &c.version));
        for o in others {
            w.put(keys::capsule(o.project_id, o.id), *o)?;
        }
        self.write_capsules(c.project_id, w)
    }
}
