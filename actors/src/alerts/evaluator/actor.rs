//! The actor: the lease that lets one node judge, standing by on the others, loading
//! everything from storage at start, and the messages it handles.

use super::*;

/// The project's lease for an evaluator of `ctx` (several nodes): taken or renewed, `None`
/// while another node's evaluator holds it; always `None` on one node.
pub(super) async fn take_lease(
    ctx: &EvaluatorCtx,
    pid: u64,
) -> Result<Option<(fleetops_storage::leases::Fence, i64)>> {
    if !ctx.bus.is_shared() {
        return Ok(None);
    }
    let (store, node, now, ttl) = (
        ctx.store.clone(),
        ctx.bus.node_id(),
        ctx.clock.now_ms(),
        ctx.lease_ttl_ms,
    );
    let taken = crate::off_thread(move || {
        Ok(store.take_lease(&crate::alerts::remote::lease_name(pid), node, now, ttl)?)
    })
    .await;
    match taken {
        // Renewed once half of it has run.
        Ok(t) => Ok(t.map(|f| (f, now + ttl / 2))),
        // The database out of reach: stand by, and look again later.
        Err(e) => {
            tracing::warn!(project = pid, error = %e, "could not take the alerting lease");
            Ok(None)
        }
    }
}

/// Bytes of other nodes' log batches one evaluator's mailbox holds at most.
pub(super) const MAX_REMOTE_LOG_BYTES: usize = 32 << 20;

/// How often a standing-by evaluator looks whether the lease is free.
pub(super) const STAND_BY_MS: i64 = 1_000;

/// Forwards the other nodes' signals of project `pid` to its evaluator here.
pub(super) async fn listen(
    bus: &crate::bus::Bus,
    pid: u64,
    me: ActorRef<Envelope<EvaluatorMsg>>,
) -> Result<crate::bus::Listener> {
    let mut sub = bus
        .subscribe(&crate::alerts::remote::subject(pid))
        .await
        .map_err(|e| crate::error::Error::Internal(e.to_string()))?;
    let queued = Arc::new(AtomicUsize::new(0));
    Ok(crate::bus::Listener::spawn(async move {
        while let Some(m) = sub.next().await {
            let msg = match crate::alerts::remote::decode(&m.payload) {
                Some(crate::alerts::remote::Signal::Heartbeat {
                    device_id,
                    at,
                    metrics,
                }) => EvaluatorMsg::Heartbeat {
                    device_id,
                    at,
                    metrics,
                },
                Some(crate::alerts::remote::Signal::Logs { device_id, chunk }) => {
                    // Bounded as the local batches are: past the bound it is not seen.
                    let bytes = m.payload.len();
                    if queued.fetch_add(bytes, Ordering::Relaxed) + bytes > MAX_REMOTE_LOG_BYTES {
                        queued.fetch_sub(bytes, Ordering::Relaxed);
                        continue;
                    }
                    EvaluatorMsg::Logs {
                        device_id,
                        chunk,
                        _budget: Budget {
                            bytes,
                            used: queued.clone(),
                        },
                    }
                }
                Some(crate::alerts::remote::Signal::Rollout { device_id, status }) => {
                    EvaluatorMsg::Rollout { device_id, status }
                }
                Some(crate::alerts::remote::Signal::DevicesChanged) => EvaluatorMsg::DevicesChanged,
                None => continue,
            };
            if me.cast(Envelope::cast(msg)).is_err() {
                break;
            }
        }
    }))
}

/// The evaluator's state read from storage; `judge`: devices and states brought up to date
/// and written (not while standing by, when nothing is written).
pub(super) async fn load(
    ctx: EvaluatorCtx,
    pid: u64,
    lease: Option<(fleetops_storage::leases::Fence, i64)>,
    judge: bool,
) -> std::result::Result<EvaluatorState, ActorProcessingErr> {
    let store = ctx.store.clone();
    let slug = store
        .project(pid)?
        .map(|p| p.slug.clone())
        .ok_or_else(|| format!("project {pid} does not exist"))?;
    let mut st = EvaluatorState {
        pid,
        pending: Pending::Nothing,
        slug,
        rules: Vec::new(),
        log_rules: Vec::new(),
        log_set: None,
        states: store
            .condition_states(pid)?
            .into_iter()
            .map(|s| ((s.rule_id, s.device_id), s))
            .collect(),
        last_seen: HashMap::new(),
        // Rollout results reach the evaluator as events, which a restart loses.
        reconcile_due: true,
        online_since: HashMap::new(),
        metrics: HashMap::new(),
        windows: HashMap::new(),
        heap: BinaryHeap::new(),
        scheduled: HashMap::new(),
        lease,
        next_try: 0,
        _listening: None,
        ctx,
    };
    st.rules = st.load()?;
    if judge {
        let now = st.ctx.clock.now_ms();
        let mut ch = Changes::default();
        // Devices and states from storage (online since: unknown after a restart, so counted
        // from the last heartbeat at the latest).
        st.refresh_devices(now, &mut ch)?;
        st.commit(ch).await?;
    }
    Ok(st)
}
impl Actor for RuleEvaluator {
    type Msg = Envelope<EvaluatorMsg>;
    type State = EvaluatorState;
    type Arguments = (EvaluatorCtx, u64);

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        (ctx, pid): Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        myself.send_interval(ctx.tick, || Envelope::cast(EvaluatorMsg::Tick));
        let lease = take_lease(&ctx, pid).await?;
        let standby = ctx.bus.is_shared() && lease.is_none();
        // Judging: the other nodes' signals come here.
        let listening = if lease.is_some() {
            Some(listen(&ctx.bus, pid, myself.clone()).await?)
        } else {
            None
        };
        let mut st = load(ctx, pid, lease, !standby).await?;
        st._listening = listening;
        Ok(st)
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let Some(msg) = msg.open() else {
            return Ok(());
        };
        // Its organization deleted: nothing more is judged or written.
        if st.ctx.store.project_retired(st.pid) {
            myself.stop(None);
            return Ok(());
        }
        let now = st.ctx.clock.now_ms();
        if st.ctx.bus.is_shared() {
            let due = match &st.lease {
                Some((_, renew_at)) => now >= *renew_at,
                None => now >= st.next_try,
            };
            if matches!(msg, EvaluatorMsg::Tick) && due {
                match take_lease(&st.ctx, st.pid).await? {
                    Some(lease) if st.lease.is_none() => {
                        // Taken over: judge from what is stored now, with every node's signals.
                        let listening = listen(&st.ctx.bus, st.pid, myself.clone()).await?;
                        *st = load(st.ctx.clone(), st.pid, Some(lease), true).await?;
                        st._listening = Some(listening);
                    }
                    Some(lease) => st.lease = Some(lease),
                    None => {
                        st.lease = None;
                        st._listening = None;
                        st.next_try = now + STAND_BY_MS;
                    }
                }
            }
            if st.lease.is_none() {
                // Standing by: another node's evaluator judges the project.
                return Ok(());
            }
        }
        let started = std::time::Instant::now();
        let mut ch = Changes::default();
        match msg {
            // An event is judged by the rules and devices as they are when it comes: a reread
            // owed for changes made before it is done first (the change's answer went out
            // after its signal was sent, so every event sent after that answer is judged with
            // it).
            EvaluatorMsg::Heartbeat {
                device_id,
                at,
                metrics,
            } => {
                st.flush_pending(now, &mut ch)?;
                st.heartbeat(device_id, at, metrics, now, &mut ch)?
            }
            EvaluatorMsg::Logs {
                device_id, chunk, ..
            } => {
                st.flush_pending(now, &mut ch)?;
                st.logs(device_id, &chunk, now, &mut ch)?
            }
            EvaluatorMsg::Rollout { device_id, status } => {
                st.flush_pending(now, &mut ch)?;
                st.rollout(device_id, status, now, &mut ch)?
            }
            EvaluatorMsg::RolloutsMissed => st.reconcile_due = true,
            // Both reread storage, at the next event or tick: a burst of changes (a script
            // creating 100 rules) is reread once.
            EvaluatorMsg::RulesChanged => st.pending = st.pending.max(Pending::Rules),
            EvaluatorMsg::DevicesChanged => st.pending = st.pending.max(Pending::Devices),
            #[cfg(feature = "fault-injection")]
            EvaluatorMsg::Panic => panic!("injected fault in the evaluator of project {}", st.pid),
            EvaluatorMsg::Tick => {
                st.flush_pending(now, &mut ch)?;
                if std::mem::take(&mut st.reconcile_due) {
                    let latest = st.latest_results(now).await?;
                    st.reconcile_rollouts(&latest, now, &mut ch)?;
                }
                st.tick(now, &mut ch)?
            }
        }
        // The evaluation itself, the write and its fsync left out.
        st.ctx
            .busy_ns
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        match st.commit(ch).await {
            // Another node took the lease (this one stalled past it): nothing was written;
            // stand by.
            Err(crate::error::Error::Conflict(w)) if w == "lease" => {
                st.lease = None;
                st._listening = None;
                st.next_try = now + STAND_BY_MS;
                Ok(())
            }
            other => Ok(other?),
        }
    }
}
