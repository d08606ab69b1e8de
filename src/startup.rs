//! Builds the application from settings (store, start-up sweep, both listeners bound) and runs it until a shutdown
//! signal: the data workers, the admin listener, the stats batcher, the catalog's sync, the database probe, cache
//! housekeeping, the blob sweep and upload expiry; then drains within `timeouts.shutdown_grace`.
//! Tests call `Application::build` with port 0 and read the bound addresses back.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::access_log::{self, AccessLog};
use crate::auth::Authorizer;
use crate::catalog::{Catalog, StalenessBounds};
use crate::config::Settings;
use crate::driver::tls::{HandshakeFailure, TlsServer};
use crate::driver::{self, DriverContext};
use crate::http::{
    AdminParts, AdminState, DataParts, DataState, admin::admin_router, data_service, range::RangePolicy,
    refusal_response,
};
use crate::store::{DatabaseHealth, Metadata, Store, SweepReport};

/// At exit, how long closing the database's connections may take (a connection still held by a request past
/// the grace period, or a server that does not answer, would hold it for ever).
const DATABASE_CLOSE: Duration = Duration::from_secs(2);

/// Download records buffered between the driver and the stats batcher; a full channel drops (and counts).
const STATS_CHANNEL_CAPACITY: usize = 64 * 1024;
/// How often the readiness probe asks the database, and how long it waits for the answer.
const PROBE_EVERY: Duration = Duration::from_secs(1);
/// How often the download stats ledger is folded into the totals: the longer, the more downloads of an object
/// (and of its neighbours in key order) share one write of a total's page; readers count the ledger meanwhile.
const STATS_FOLD_EVERY: Duration = Duration::from_secs(60);
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

pub struct Application {
    settings: Arc<Settings>,
    data: DataState,
    admin: AdminState,
    /// One per data worker, all bound to the same address with SO_REUSEPORT.
    data_listeners: Vec<std::net::TcpListener>,
    admin_listener: TcpListener,
    /// The access log and its writer thread, when `access_log` is set.
    access_log: Option<(AccessLog, access_log::Writer)>,
    /// HTTPS on both listeners, when `tls.cert` and `tls.key` are set.
    tls: Option<Arc<TlsServer>>,
}

impl Application {
    /// Opens the store (creating the data dir if it is missing) and binds both listeners. A start that fails
    /// leaves no data dir behind that it created: a mistyped `--data-dir` next to a bad setting must not leave an
    /// empty data dir that the next, corrected, start then takes for the real one.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        let data_dir = settings.data_dir.clone();
        let created = !data_dir.exists();
        let built = Self::build_in(settings).await;
        if built.is_err() && created && data_dir.is_dir() {
            if let Err(e) = std::fs::remove_dir_all(&data_dir) {
                tracing::warn!(path = %data_dir.display(), error = %e, "cannot remove the data dir this failed start created");
            }
        }
        built
    }

    async fn build_in(settings: Settings) -> anyhow::Result<Self> {
        // The recorder first: what start-up measures (the certificate's expiry, say) must not be lost.
        crate::metrics::prometheus();
        // Before the first burst: freed buffers go back to the kernel instead of staying at the burst's peak.
        driver::return_freed_memory_promptly();
        // The listeners first: an address in use fails the start before anything is created.
        let data_listeners = driver::bind_data_listeners(settings.listen, settings.runtime.worker_count())
            .with_context(|| format!("cannot listen on {} (listen)", settings.listen))?;
        let admin_listener = driver::listen_exclusive(settings.admin_listen, 1024)
            .and_then(|socket| TcpListener::from_std(socket.into()))
            .with_context(|| format!("cannot listen on {} (admin_listen)", settings.admin_listen))?;
        // Before the store: a bad certificate or key fails the start with nothing created.
        let tls = TlsServer::from_settings(&settings.tls)?;
        let database = settings.database_url()?;
        let store = Store::open(&settings.data_dir, &database, settings.timeouts.database())
            .await?
            .with_blob_store(&settings, true)
            .await?;
        if let Some(note) = store.meta.migrations().newer_note() {
            // A rollback, or an old replica restarting mid-rollout: tolerated by the upgrade rule.
            tracing::warn!(
                "{note}; serving on, as a newer release only adds tables, columns with defaults and indexes that the \
                 one before ignores (docs/operations.md, \"Upgrades and rollbacks\")"
            );
        }
        if store.meta.link_may_be_plaintext() {
            tracing::warn!(
                %database,
                "database.url does not require TLS to a database on another host: the password and query results \
                 may cross the network in clear, and an on-path attacker can read and change them; add \
                 sslmode=verify-full (and sslrootcert=FILE, the CA that signed the server's certificate)"
            );
        }
        match crate::store::loose_data_dir_mode(&settings.data_dir) {
            Ok(Some(mode)) => tracing::warn!(
                path = %settings.data_dir.display(),
                mode = format_args!("{mode:04o}"),
                "data dir is open to other local users, who could read signing keys and private objects; \
                 chmod 700 it"
            ),
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(path = %settings.data_dir.display(), error = %e, "cannot read the data dir's mode")
            }
        }
        // Only `tmp/` before serving (a retired blob a row references goes back first); the blobs and part files
        // in the background (`Application::run_until`), as their walk grows with their number.
        let swept = store.sweep_at_start(settings.timeouts.sweep_grace).await.context("start-up sweep failed")?;
        log_sweep(&swept, "start-up sweep removed leftovers");
        if store.cache.is_some() {
            // In the background, now and then every grace period: a store's listing may be long, and a store that
            // is down must not keep the server from serving what it has cached.
            let (store, grace) = (store.clone(), settings.timeouts.sweep_grace);
            tokio::spawn(async move {
                loop {
                    match store.sweep_object_store(grace).await {
                        Ok(0) => {}
                        Ok(deleted) => tracing::info!(deleted, "object-store sweep deleted unreferenced blobs"),
                        Err(e) => {
                            tracing::warn!(error = %format!("{e:#}"), "could not sweep the object store; it will again")
                        }
                    }
                    tokio::time::sleep(grace.max(Duration::from_secs(60))).await;
                }
            });
        }
        let dropped = metrics::counter!(crate::metrics::ACCESS_LOG_DROPPED);
        let access_log_mode = settings.access_log_mode()?;
        let access_log =
            settings.access_log.as_deref().map(|path| access_log::start(path, access_log_mode, dropped)).transpose()?;
        let open_files = raise_open_file_limit();
        // A quarter of the fd budget for cached blobs; the rest is for connections and the database.
        let staleness = StalenessBounds {
            credentials: settings.database.max_staleness,
            public: settings.database.public_max_staleness,
        };
        let catalog = Catalog::new(store.meta.clone(), store.blobs.clone(), (open_files / 4).min(4096) as usize)
            .await?
            .with_staleness_bounds(staleness)
            .with_metadata_bytes(settings.cache.metadata_bytes)
            .with_blob_cache(store.cache.clone());
        let settings = Arc::new(settings);
        let catalog = Arc::new(catalog);
        let data = DataState::new(DataParts {
            catalog: catalog.clone(),
            auth: Authorizer::new(catalog.clone(), settings.auth.presign_max_lifetime)
                .with_s3_region(&settings.s3.region),
            range_policy: RangePolicy::default(),
            log_principal: access_log.is_some(),
            s3_domain: settings.s3_domain()?,
            throttle: Default::default(),
        });
        let admin = AdminState::new(AdminParts {
            store,
            settings: settings.clone(),
            prometheus: crate::metrics::prometheus(),
            ready: AtomicBool::new(false),
            database: Arc::new(DatabaseHealth::new()),
            uploads: tokio::sync::Semaphore::new(settings.limits.max_concurrent_uploads),
            data: data.clone(),
        });
        Ok(Self { settings, data, admin, data_listeners, admin_listener, access_log, tls })
    }

    pub fn data_addr(&self) -> SocketAddr {
        self.data_listeners[0].local_addr().expect("a bound listener has an address")
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_listener.local_addr().expect("a bound listener has an address")
    }

    /// Serves until `signal` resolves, then stops accepting, lets in-flight responses finish within
    /// `timeouts.shutdown_grace`, and returns.
    pub async fn run_until(self, signal: impl Future<Output = ()>) -> anyhow::Result<()> {
        let shutdown = CancellationToken::new();
        let tracker = TaskTracker::new();
        let catalog = self.data.catalog.clone();
        let feed = self.admin.store.meta.feed().clone();
        let syncing = tokio::spawn(async move { catalog.keep_synced().await });
        let watched = feed.clone();
        let watcher = tokio::spawn(async move { watched.watch().await });
        let catalog = self.data.catalog.clone();
        let housekeeping = tokio::spawn(async move {
            // The change log is pruned once a minute (SQLite: up to what the caches have applied; PostgreSQL: by
            // age, see `ChangeFeed::prune`).
            let mut tick = tokio::time::interval(Duration::from_secs(60));
            tick.tick().await;
            loop {
                tick.tick().await;
                if let Err(e) = feed.prune(catalog.applied()).await {
                    tracing::debug!(error = %e, "pruning the cache change log failed; will retry");
                }
            }
        });
        let meta = self.admin.store.meta.clone();
        let folding = tokio::spawn(async move {
            // Download stats flushed to the ledger are added to the totals once a minute, in key order
            // (`Metadata::fold_stats`); readers count the ledger meanwhile, so nothing waits for this.
            let mut tick = tokio::time::interval(STATS_FOLD_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                match meta.fold_stats().await {
                    Ok(folded) => tracing::debug!(
                        rows = folded.rows,
                        objects = folded.objects,
                        chunks = folded.chunks,
                        deleted = folded.deleted,
                        folding_ms = folded.folding.as_millis() as u64,
                        deleting_ms = folded.deleting.as_millis() as u64,
                        "download stats folded"
                    ),
                    Err(e) => tracing::warn!(error = %e, "folding the download stats ledger failed; will retry"),
                }
            }
        });
        crate::metrics::register_all(
            crate::auth::FailureReason::ALL.map(crate::auth::FailureReason::label),
            HandshakeFailure::ALL.map(HandshakeFailure::label),
        );
        let reloading = self.tls.clone().map(|tls| tokio::spawn(tls.reload_on_request()));
        // The gauge says what /readyz says from the first request on, not 0 until the first probe returns.
        metrics::gauge!(crate::metrics::DATABASE_UP).set(if self.admin.database.is_reachable() { 1.0 } else { 0.0 });
        let probe = tokio::spawn(probe_database(
            self.admin.store.meta.clone(),
            self.admin.database.clone(),
            self.data.catalog.clone(),
        ));
        let store_probe = self.data.catalog.blob_cache().map(|cache| {
            cache.remote().observe_calls(crate::metrics::blob_store_call);
            tokio::spawn(probe_blob_store(cache.remote().clone()))
        });
        let sweeping = tokio::spawn(sweep_blobs(self.admin.store.clone(), self.settings.timeouts.sweep_grace));
        let expiry = self.settings.timeouts.multipart_upload_expiry;
        let expiring =
            tokio::spawn(self.admin.store.clone().expire_uploads(expiry, crate::metrics::multipart_uploads_expired));
        let prometheus = self.admin.prometheus.clone();
        let upkeep = tokio::spawn(async move {
            // Histograms are drained into the exporter's buckets by upkeep.
            let mut tick = tokio::time::interval(Duration::from_secs(5));
            loop {
                tick.tick().await;
                prometheus.run_upkeep();
            }
        });

        let (data_addr, admin_addr) = (self.data_addr(), self.admin_addr());
        let (recorder, records) = crate::metrics::downloads::channel(STATS_CHANNEL_CAPACITY);
        let stop_batcher = CancellationToken::new();
        let batcher = tokio::spawn(crate::metrics::downloads::run_batcher(
            self.admin.store.meta.clone(),
            records,
            self.settings.limits.stats_buffer_objects,
            stop_batcher.clone(),
        ));
        let mut ctx = DriverContext::new(
            data_service(self.admin.clone(), self.settings.timeouts.handler, self.settings.listen_read_only),
            refusal_response,
            &self.settings,
            recorder.clone(),
        );
        let (access_log, access_log_writer) = self.access_log.unzip();
        ctx.access_log = access_log.clone();
        ctx.tls = self.tls.clone();
        let ctx = Arc::new(ctx);
        // The admin listener is the same driver on this runtime, with bodies; its GetObject downloads are recorded
        // and counted as the data listener's are.
        let mut admin_ctx =
            DriverContext::new(admin_router(self.admin.clone()), refusal_response, &self.settings, recorder)
                .for_admin(admin_principal);
        admin_ctx.access_log = access_log;
        if !self.settings.access_log_probes {
            admin_ctx.unlogged_paths = crate::http::PROBE_PATHS;
        }
        admin_ctx.tls = self.tls.clone();
        // One budget for request bodies in memory, whichever listener they arrive on.
        admin_ctx.body_budget = ctx.body_budget.clone();
        let admin_ctx = Arc::new(admin_ctx);
        let grace = self.settings.timeouts.shutdown_grace;
        let workers = driver::spawn_workers(self.data_listeners, ctx, &self.settings.limits, shutdown.clone(), grace)
            .context("cannot start the data workers")?;
        let admin = {
            let (settings, shutdown, tracker) = (self.settings.clone(), shutdown.clone(), tracker.clone());
            tokio::spawn(async move {
                driver::serve_admin(self.admin_listener, admin_ctx, &settings.limits, shutdown, tracker).await
            })
        };
        self.admin.ready.store(true, Ordering::Release);
        // The bound addresses, not the configured ones: with port 0 this is how callers learn the ports.
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        tracing::info!(data = %data_addr, admin = %admin_addr, scheme, "blobgate is serving");

        signal.await;
        tracing::info!("shutting down: no new connections; waiting for in-flight responses");
        self.admin.ready.store(false, Ordering::Release);
        shutdown.cancel();
        // One grace period for everything in flight, data and admin listeners alike; what follows it (the last
        // stats, closing the database) is bounded too, so a database that is down cannot hold the exit.
        let drained_by = tokio::time::Instant::now() + grace;
        let _ = admin.await;
        // Each data worker drains its own connections (within the grace period) before its thread ends.
        let _ = tokio::task::spawn_blocking(move || workers.into_iter().for_each(|w| drop(w.join()))).await;
        tracker.close();
        if tokio::time::timeout_at(drained_by, tracker.wait()).await.is_err() {
            tracing::warn!(open = tracker.len(), "shutdown grace period over; dropping remaining connections");
        }
        // Connections are done: write the last download stats, then close the database.
        stop_batcher.cancel();
        let _ = batcher.await;
        if let Some(writer) = access_log_writer {
            let _ = tokio::task::spawn_blocking(move || writer.finish()).await;
        }
        upkeep.abort();
        if let Some(reloading) = reloading {
            reloading.abort();
        }
        probe.abort();
        if let Some(store_probe) = store_probe {
            store_probe.abort();
        }
        expiring.abort();
        // Between batches or inside one: a blob retired by an uncommitted batch is put back by the next start.
        sweeping.abort();
        housekeeping.abort();
        // Between chunks or inside one: the cursor is where the last committed chunk left it, and the next fold
        // resumes there.
        folding.abort();
        syncing.abort();
        watcher.abort();
        if tokio::time::timeout(DATABASE_CLOSE, self.admin.store.meta.close()).await.is_err() {
            tracing::warn!("the database connections did not close in time; exiting without them");
        }
        tracing::info!("stopped");
        Ok(())
    }
}

/// The readiness probe: `SELECT 1` every [`PROBE_EVERY`], each within [`PROBE_TIMEOUT`], so `/readyz` reports a
/// verdict at most about two seconds old without ever waiting on the database itself. An outage is logged when it
/// starts and when it ends, not at every probe. It also publishes the age of the caches' last sync.
/// Sweeps the blobs and part files at once, then every grace period (at least a minute), until aborted: in the
/// background, as the walk takes time in proportion to the blobs (`Store::sweep_blobs`, a batch at a time). An
/// error (the database away) is logged and the next round retries.
async fn sweep_blobs(store: Store, grace: Duration) {
    loop {
        match store.sweep_blobs(grace).await {
            Ok(swept) => log_sweep(&swept, "sweep removed unreferenced blobs"),
            Err(e) => tracing::warn!(error = %format!("{e:#}"), "could not sweep the blobs; it will again"),
        }
        tokio::time::sleep(grace.max(Duration::from_secs(60))).await;
    }
}

fn log_sweep(swept: &SweepReport, message: &'static str) {
    if *swept != SweepReport::default() {
        tracing::info!(
            temp_files = swept.temp_files,
            unreferenced_blobs = swept.unreferenced_blobs,
            restored_blobs = swept.restored_blobs,
            part_files = swept.part_files,
            "{message}"
        );
    }
}

async fn probe_database(meta: Metadata, health: Arc<DatabaseHealth>, catalog: Arc<Catalog>) {
    let up = metrics::gauge!(crate::metrics::DATABASE_UP);
    let sync_age = metrics::gauge!(crate::metrics::CACHE_SYNC_AGE);
    let mut tick = tokio::time::interval(PROBE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        sync_age.set(catalog.sync_age().as_secs_f64());
        let result = meta.ping(PROBE_TIMEOUT).await;
        up.set(if result.is_ok() { 1.0 } else { 0.0 });
        if health.set_reachable(result.is_ok()) {
            match result {
                Ok(()) => tracing::info!("the database answers again; ready"),
                Err(e) => {
                    let cause = format!("{:#}", anyhow::Error::from(e));
                    tracing::warn!(error = %cause, "the database does not answer; not ready (/readyz 503) until it does")
                }
            }
        }
    }
}

/// The object store's readiness probe: a one-key listing every [`PROBE_EVERY`], within the store's timeouts and
/// through its circuit breaker (whose half-open probe it often is), publishing the verdict `/readyz` reads. An
/// outage is logged when it starts and when it ends.
async fn probe_blob_store(remote: crate::store::remote::RemoteBlobs) {
    let mut tick = tokio::time::interval(PROBE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match remote.probe().await {
            (Ok(()), true) => tracing::info!(store = remote.location(), "the object store answers again; ready"),
            (Err(e), true) => tracing::warn!(
                store = remote.location(),
                error = %e,
                "the object store does not answer; not ready (/readyz 503) until it does"
            ),
            (_, false) => {}
        }
    }
}

/// Raises the soft open-file limit to the hard one (as nginx's worker_rlimit_nofile and Go's runtime do): every
/// connection and cached blob is an fd. Returns the limit in force.
fn raise_open_file_limit() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => hard,
            Err(e) => {
                tracing::warn!(error = %e, soft, hard, "cannot raise the open-file limit");
                soft
            }
        },
        Ok((soft, _)) => soft,
        Err(_) => 1024,
    }
}

/// The access log's principal on the admin listener: the presented bearer token's id.
fn admin_principal(headers: &dyn crate::header_values::fields::Fields) -> Option<access_log::Principal> {
    let token = crate::auth::bearer(headers).ok().flatten()?;
    crate::auth::token::token_id(token).map(|id| access_log::Principal::Token(id.into()))
}

/// Installs SIGINT, SIGTERM and SIGHUP handlers at once, and returns a future that resolves on SIGINT or SIGTERM.
/// Installing them before anything is bound matters: a signal that arrives before the handlers exist would kill
/// the process with the default action instead of draining it. SIGHUP (logrotate, `systemctl reload`) never stops
/// the server: it goes to [`on_hangup`] and serving goes on.
pub fn shutdown_signal() -> anyhow::Result<impl Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("cannot install a SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot install a SIGINT handler")?;
    let mut hup = signal(SignalKind::hangup()).context("cannot install a SIGHUP handler")?;
    Ok(async move {
        loop {
            tokio::select! {
                _ = term.recv() => return,
                _ = int.recv() => return,
                _ = hup.recv() => on_hangup(),
            }
        }
    })
}

/// SIGHUP: the access log's writer reopens its file (after logrotate moved it), and on HTTPS the certificate and
/// key are read again; the server keeps serving.
fn on_hangup() {
    access_log::request_reopen();
    driver::tls::request_reload();
    tracing::info!("SIGHUP received: reopening the access log and reloading the TLS pair (if any); still serving");
}
