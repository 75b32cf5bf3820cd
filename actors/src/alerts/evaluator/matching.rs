//! Log matching: a project's log rules compiled into one `RegexSet` (or matched one by one
//! when the set cannot compile), loading the rules, and counting matches in their windows.

use super::*;

/// A rule as the evaluator uses it.
pub(super) struct Loaded {
    pub(super) rule: AlertRule,
    pub(super) cond: Condition,
    pub(super) level: Option<u8>,
}

/// How a project's log rules match a line: every pattern in one set, so a line is scanned
/// once whatever the number of rules; or, when the set cannot be built, each rule's pattern
/// on its own (slower, never silent: each such rule's `health` says so).
pub(super) enum LogMatcher {
    Set(regex::RegexSet),
    Each(Vec<regex::Regex>),
}

impl LogMatcher {
    /// The indices (into the matcher's patterns) that match `msg`, into `out`.
    pub(super) fn matches(&self, msg: &str, out: &mut Vec<usize>) {
        out.clear();
        match self {
            LogMatcher::Set(set) => {
                if set.is_match(msg) {
                    out.extend(set.matches(msg).iter());
                }
            }
            LogMatcher::Each(each) => {
                out.extend(
                    each.iter()
                        .enumerate()
                        .filter(|(_, r)| r.is_match(msg))
                        .map(|(k, _)| k),
                );
            }
        }
    }
}

/// The log rules' matcher, with the indices (into `rules`) of the log rules in the order of
/// its patterns, and the rules it had to set apart (each with why).
pub(super) fn log_set(
    rules: &[Loaded],
    fail_set: bool,
) -> (Vec<usize>, Option<LogMatcher>, Unhealthy) {
    let mut idx = Vec::new();
    let mut patterns = Vec::new();
    for (i, l) in rules.iter().enumerate() {
        if let Condition::LogPattern { pattern, .. } = &l.cond {
            idx.push(i);
            patterns.push(pattern.clone());
        }
    }
    if idx.is_empty() {
        return (idx, None, Vec::new());
    }
    let limit = 256 * 1024 * patterns.len().max(1);
    let set = if fail_set {
        Err(regex::Error::CompiledTooBig(limit))
    } else {
        regex::RegexSetBuilder::new(&patterns)
            .size_limit(limit)
            .dfa_size_limit(limit)
            .build()
    };
    let why = match set {
        Ok(set) => return (idx, Some(LogMatcher::Set(set)), Vec::new()),
        Err(e) => e.to_string(),
    };
    // Each rule alone, within the limit it was checked against when written.
    let mut kept = Vec::new();
    let mut each = Vec::new();
    let mut health = Vec::new();
    for (i, p) in idx.into_iter().zip(&patterns) {
        let id = rules[i].rule.id;
        match crate::rules::alert_conditions::compile(p) {
            Ok(r) => {
                kept.push(i);
                each.push(r);
                health.push((
                    id,
                    RuleHealth::Degraded(format!(
                        "evaluated apart from the project's other log rules: their patterns \
                         could not be compiled together ({why})"
                    )),
                ));
            }
            Err(e) => health.push((
                id,
                RuleHealth::Error(format!("its pattern cannot be compiled: {e}")),
            )),
        }
    }
    tracing::warn!(
        error = %why,
        rules = ?health.iter().map(|(id, _)| id).collect::<Vec<_>>(),
        "a project's log rules could not be compiled together; each is matched on its own"
    );
    (kept, Some(LogMatcher::Each(each)), health)
}
/// The enabled rules of the project, with the ones it cannot evaluate.
pub(super) fn load_rules(store: &Store, pid: u64) -> Result<(Vec<Loaded>, Unhealthy)> {
    let mut out = Vec::new();
    let mut bad = Vec::new();
    for r in store.project_alert_rules(pid)? {
        if !r.enabled {
            continue;
        }
        let cond = serde_json::from_slice::<serde_json::Value>(&r.condition_json)
            .map_err(|e| e.to_string())
            .and_then(|v| Condition::parse(&v).map_err(|e| e.to_string()));
        let cond = match cond {
            Ok(c) => c,
            Err(e) => {
                bad.push((
                    r.id,
                    RuleHealth::Error(format!("its condition cannot be read: {e}")),
                ));
                continue;
            }
        };
        let level = match &cond {
            Condition::LogPattern { pattern, level, .. } => {
                if let Err(e) = crate::rules::alert_conditions::compile(pattern) {
                    bad.push((
                        r.id,
                        RuleHealth::Error(format!("its pattern cannot be compiled: {e}")),
                    ));
                    continue;
                }
                level.as_deref().and_then(crate::logs::parse_level)
            }
            _ => None,
        };
        out.push(Loaded {
            rule: r,
            cond,
            level,
        });
    }
    Ok((out, bad))
}

impl EvaluatorState {
    /// Matches a batch once against every log rule's pattern (one `RegexSet` pass per line,
    /// or each rule's own when they could not be compiled together), then counts per rule
    /// with its level and module.
    pub(super) fn logs(
        &mut self,
        device: u64,
        chunk: &LogChunk,
        now: i64,
        ch: &mut Changes,
    ) -> Result<()> {
        let Some(matcher) = &self.log_set else {
            return Ok(());
        };
        let mut applicable = Vec::with_capacity(self.log_rules.len());
        for &i in &self.log_rules {
            let l = &self.rules[i];
            let level_present = l.level.is_none_or(|lv| chunk.level_mask & (1 << lv) != 0);
            applicable.push(level_present && self.applies(&l.rule, device)?);
        }
        if !applicable.iter().any(|a| *a) {
            return Ok(());
        }
        // The levels some applicable rule looks at: lines of other levels are never matched.
        let levels: u8 = self
            .log_rules
            .iter()
            .zip(&applicable)
            .filter(|(_, a)| **a)
            .map(|(&i, _)| self.rules[i].level.map_or(0xff, |l| 1u8 << l))
            .fold(0, |m, x| m | x);
        if chunk.level_mask & levels == 0 {
            return Ok(());
        }
        let mut counts = vec![0usize; self.log_rules.len()];
        let mut hits = Vec::new();
        for e in 0..chunk.len() {
            if chunk.level_at(e).is_some_and(|l| levels & (1u8 << l) == 0) {
                continue;
            }
            let Some(msg) = chunk.message(e) else {
                continue;
            };
            matcher.matches(msg, &mut hits);
            for &k in &hits {
                if !applicable.get(k).copied().unwrap_or(false) {
                    continue;
                }
                let Some(&i) = self.log_rules.get(k) else {
                    continue;
                };
                let l = &self.rules[i];
                if l.level.is_some_and(|lv| chunk.level_at(e) != Some(lv)) {
                    continue;
                }
                if let Condition::LogPattern {
                    module: Some(m), ..
                } = &l.cond
                {
                    let idx = chunk.module_at(e).map(|x| x as usize);
                    if idx.and_then(|x| chunk.modules.get(x)) != Some(m) {
                        continue;
                    }
                }
                counts[k] += 1;
            }
        }
        for (k, matched) in counts.into_iter().enumerate() {
            if matched == 0 {
                continue;
            }
            let i = self.log_rules[k];
            let Condition::LogPattern {
                count,
                window_seconds,
                ..
            } = self.rules[i].cond
            else {
                continue;
            };
            let (rule_id, count) = (self.rules[i].rule.id, count as usize);
            let window_ms = (window_seconds as i64).saturating_mul(1000);
            let w = self.windows.entry((rule_id, device)).or_default();
            for _ in 0..matched.min(count) {
                w.push_back(now);
            }
            while w.len() > count {
                w.pop_front();
            }
            let front = w.front().copied().unwrap_or(now);
            let holds = w.len() >= count && front > now - window_ms;
            if holds && !self.states.contains_key(&(rule_id, device)) {
                self.fire(i, device, now, now, ch)?;
            }
            // Looked at again when its oldest match leaves: resolves, or frees the window.
            self.schedule(Due::Window(rule_id, device), front + window_ms);
        }
        Ok(())
    }

    pub(super) fn window_due(
        &mut self,
        rule_id: u64,
        device: u64,
        now: i64,
        ch: &mut Changes,
    ) -> Result<()> {
        let Some(i) = self.rules.iter().position(|l| l.rule.id == rule_id) else {
            return Ok(());
        };
        let Condition::LogPattern {
            count,
            window_seconds,
            ..
        } = self.rules[i].cond
        else {
            return Ok(());
        };
        let window_ms = (window_seconds as i64).saturating_mul(1000);
        let w = self.windows.entry((rule_id, device)).or_default();
        while w.front().is_some_and(|t| *t <= now - window_ms) {
            w.pop_front();
        }
        if w.len() >= count as usize {
            let front = w.front().copied().unwrap_or(now);
            self.schedule(Due::Window(rule_id, device), front + window_ms);
        } else {
            if w.is_empty() {
                self.windows.remove(&(rule_id, device));
            } else if let Some(front) = w.front().copied() {
                // Below the count: look again when its oldest match leaves, to free it.
                self.schedule(Due::Window(rule_id, device), front + window_ms);
            }
            if let Some(s) = self.states.get(&(rule_id, device)).cloned() {
                self.clear(i, device, &s, now, ch)?;
            }
        }
        Ok(())
    }
}
