//! HTTPS on both listeners, with rustls: the certificate pair (loaded at start, reloaded on SIGHUP), the handshake
//! between accept and the first head, and user-space TLS for the connections the kernel does not encrypt.
//!
//! User-space TLS is the one declared exception to "object bytes never pass through our memory": a body region is
//! read with `pread` in [`BODY_CHUNK`] pieces into one buffer per response (allocated at its first piece, freed
//! when the response is sent: an idle keep-alive connection holds none), rustls encrypts each piece into its own
//! buffer, and the records leave with one `writev` per piece.
//! A piece that is not in the page cache is read on the blocking pool, as a cold sendfile chunk is, so a disk
//! wait never stalls the event loop. Everything here goes through tokio's safe socket calls (`try_read`,
//! `try_write_vectored`); readiness follows the same rule as `send.rs` (cleared only by a call that saw EAGAIN).

use std::fs::File;
use std::io::{self, Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use rustls::ServerConfig;
use rustls::server::ServerConnection;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpStream;

use super::fair;
use super::ktls::{self, KernelTls};
use super::send::{self, RegionCursor, SendObserver, SendOptions, SendOutcome, SendReport};
use super::sys;
use crate::config::{KtlsMode, TlsSettings};
use crate::file_body::{FileBody, Segment};

/// Plaintext bytes of a body region read and encrypted at a time in user space: large enough that the reads, the
/// records' overhead and the `writev`s are few, small enough for one buffer per sending connection.
pub const BODY_CHUNK: usize = 128 * 1024;

/// The only ALPN protocol offered: the driver speaks HTTP/1.1.
const ALPN_HTTP11: &[u8] = b"http/1.1";

/// Why the TLS settings cannot be used; each message names its key.
#[derive(Debug, thiserror::Error)]
pub enum TlsConfigError {
    #[error("tls.{key}: cannot read {}: {source}", path.display())]
    Read { key: &'static str, path: PathBuf, source: io::Error },
    #[error("tls.cert: {} holds no PEM certificate", path.display())]
    NoCertificate { path: PathBuf },
    #[error("tls.cert: {} is not valid PEM: {reason}", path.display())]
    BadCertificate { path: PathBuf, reason: String },
    #[error("tls.key: {} holds no PEM private key (PKCS#8, PKCS#1 or SEC1)", path.display())]
    NoKey { path: PathBuf },
    #[error("tls.key: {} does not match the certificate in tls.cert ({})", key.display(), cert.display())]
    Mismatch { key: PathBuf, cert: PathBuf },
    #[error("tls.key: {} cannot be used: {reason}", path.display())]
    Unusable { path: PathBuf, reason: String },
    #[error("tls.ktls is `required`, but {0}")]
    KernelTlsMissing(String),
}

/// Why a handshake did not finish (`blobgate_tls_handshake_failures_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandshakeFailure {
    /// The client spoke plain HTTP to the HTTPS port (it gets a plain-text 400).
    PlainHttp,
    /// Not finished within `timeouts.header_read`.
    Timeout,
    /// The client closed the connection mid-handshake.
    Closed,
    /// The client sent an alert (it did not trust the certificate, say).
    ClientAlert,
    /// No protocol version, cipher suite, signature scheme or ALPN protocol in common.
    Incompatible,
    /// Bytes that are not a TLS handshake.
    Malformed,
    /// The socket failed.
    Io,
    /// The kernel did not take the session's keys (the connection is closed: its keys were already given away).
    KernelRefused,
}

impl HandshakeFailure {
    pub const ALL: [HandshakeFailure; 8] = [
        HandshakeFailure::PlainHttp,
        HandshakeFailure::Timeout,
        HandshakeFailure::Closed,
        HandshakeFailure::ClientAlert,
        HandshakeFailure::Incompatible,
        HandshakeFailure::Malformed,
        HandshakeFailure::Io,
        HandshakeFailure::KernelRefused,
    ];

    pub fn label(self) -> &'static str {
        match self {
            HandshakeFailure::PlainHttp => "plain_http",
            HandshakeFailure::Timeout => "timeout",
            HandshakeFailure::Closed => "closed",
            HandshakeFailure::ClientAlert => "client_alert",
            HandshakeFailure::Incompatible => "incompatible",
            HandshakeFailure::Malformed => "malformed",
            HandshakeFailure::Io => "io",
            HandshakeFailure::KernelRefused => "ktls_refused",
        }
    }

    pub(super) fn of(error: &rustls::Error) -> Self {
        use rustls::Error as E;
        match error {
            E::AlertReceived(_) => HandshakeFailure::ClientAlert,
            E::PeerIncompatible(_) | E::NoApplicationProtocol => HandshakeFailure::Incompatible,
            _ => HandshakeFailure::Malformed,
        }
    }
}

/// The HTTPS side of both listeners: the current certificate pair and the `tls.ktls` choice.
pub struct TlsServer {
    cert: PathBuf,
    key: PathBuf,
    mode: KtlsMode,
    /// Replaced whole by a reload; each handshake takes the one current at its start.
    configs: RwLock<Arc<Configs>>,
    /// The kTLS cipher types the kernel has (probed at start); empty: every connection is user-space TLS.
    kernel_ciphers: Vec<u16>,
    /// Why connections are encrypted in user space under `auto`, said once, at the first such connection.
    fallback_reason: Option<String>,
    fallback_warned: AtomicBool,
}

impl TlsServer {
    /// The server for `settings`, or `None` when HTTPS is off; every problem is an error naming its key.
    pub fn from_settings(settings: &TlsSettings) -> anyhow::Result<Option<Arc<Self>>> {
        let Some((cert, key)) = settings.pair()? else { return Ok(None) };
        let probed = match settings.ktls {
            KtlsMode::Off => Ok(Vec::new()),
            _ => sys::kernel_tls_ciphers(
                ktls::KERNEL_CIPHERS.into_iter().filter_map(|cipher| Some((cipher, ktls::zero_key_info(cipher)?))),
            )
            .and_then(|ciphers| match ciphers.is_empty() {
                true => Err("the kernel's TLS has none of AES-GCM-128, AES-GCM-256 and ChaCha20-Poly1305".into()),
                false => Ok(ciphers),
            }),
        };
        let (kernel_ciphers, fallback_reason) = match (settings.ktls, probed) {
            (_, Ok(ciphers)) => (ciphers, None),
            (KtlsMode::Required, Err(why)) => return Err(TlsConfigError::KernelTlsMissing(why).into()),
            (_, Err(why)) => (Vec::new(), Some(why)),
        };
        let configs = load_pair(cert, key, &kernel_ciphers)?;
        configs.publish_expiry(cert);
        Ok(Some(Arc::new(Self {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            mode: settings.ktls,
            configs: RwLock::new(configs),
            kernel_ciphers,
            fallback_reason,
            fallback_warned: AtomicBool::new(false),
        })))
    }

    /// Reads the pair again (SIGHUP): new connections use it; on any error the pair in use stays.
    pub fn reload(&self) -> Result<(), TlsConfigError> {
        let configs = load_pair(&self.cert, &self.key, &self.kernel_ciphers)?;
        configs.publish_expiry(&self.cert);
        *self.configs.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = configs;
        Ok(())
    }

    /// Reloads the pair at each [`request_reload`] (SIGHUP), for as long as the process runs.
    pub async fn reload_on_request(self: Arc<Self>) {
        loop {
            RELOAD.notified().await;
            match self.reload() {
                Ok(()) => tracing::info!(cert = %self.cert.display(), "SIGHUP: reloaded the TLS certificate and key"),
                Err(e) => {
                    tracing::error!(error = %e, "SIGHUP: cannot reload the TLS certificate and key; the pair in use stays")
                }
            }
        }
    }

    fn current(&self) -> Arc<Configs> {
        self.configs.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Runs the server side of a handshake on `stream` (the caller bounds it with `timeouts.header_read`).
    /// `PlainHttp` when the first byte cannot start a TLS record: nothing was read from the socket then.
    /// A client whose ClientHello offers a cipher suite the kernel has gets a kernel session; any other, user-space
    /// TLS (the first such connection logs why, once).
    pub async fn accept(&self, stream: &TcpStream, send_timeout: Duration) -> Result<Session, HandshakeFailure> {
        let mut first = [0u8; 1];
        match stream.peek(&mut first).await {
            Ok(0) => return Err(HandshakeFailure::Closed),
            Ok(_) if first[0] != HANDSHAKE_RECORD => return Err(HandshakeFailure::PlainHttp),
            Ok(_) => {}
            Err(_) => return Err(HandshakeFailure::Io),
        }
        let configs = self.current();
        let hello_record = match &configs.kernel {
            None => Vec::new(),
            Some(kernel) => {
                let (record, hello) = ktls::read_hello(stream).await?;
                if let ktls::Hello::Suites(offered) = &hello
                    && offered.iter().any(|suite| configs.kernel_suites.contains(suite))
                {
                    return ktls::handshake(stream, kernel.clone(), send_timeout, record).await.map(Session::Kernel);
                }
                self.warn_once("a client offered no cipher suite the kernel has");
                record
            }
        };
        let config = configs.userspace.clone();
        self.accept_in_user_space(stream, config, send_timeout, hello_record).await.map(Session::User)
    }

    fn warn_once(&self, why: &str) {
        if !self.fallback_warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(reason = %why, tls_ktls = ?self.mode, "HTTPS connections are encrypted in user space: bodies are copied (pread and encrypt) instead of sent by sendfile");
        }
    }

    /// `first`: the records already read from the socket (the ClientHello, when the kernel's suites were asked).
    async fn accept_in_user_space(
        &self,
        stream: &TcpStream,
        config: Arc<ServerConfig>,
        send_timeout: Duration,
        first: Vec<u8>,
    ) -> Result<Box<UserTls>, HandshakeFailure> {
        let mut conn = ServerConnection::new(config).map_err(|_| HandshakeFailure::Malformed)?;
        let mut first = &first[..];
        loop {
            flush(&mut conn, stream, send_timeout, 0).await.map_err(|_| HandshakeFailure::Io)?;
            if !conn.is_handshaking() {
                break;
            }
            let read = if first.is_empty() {
                if stream.readable().await.is_err() {
                    return Err(HandshakeFailure::Io);
                }
                conn.read_tls(&mut SocketIo(stream))
            } else {
                conn.read_tls(&mut first)
            };
            match read {
                Ok(0) => return Err(HandshakeFailure::Closed),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(_) => return Err(HandshakeFailure::Io),
            }
            if let Err(e) = conn.process_new_packets() {
                // rustls queued an alert that says why; the client may read it before the close.
                let _ = conn.write_tls(&mut SocketIo(stream));
                return Err(HandshakeFailure::of(&e));
            }
        }
        // Bodies are written a chunk at a time and flushed before the next: the chunk bounds rustls's buffer.
        conn.set_buffer_limit(None);
        if let Some(why) = &self.fallback_reason {
            self.warn_once(why);
        }
        Ok(Box::new(UserTls { conn, body: Vec::new(), eof: false }))
    }
}

/// Set by SIGHUP; the server's reload task waits on it (a permit is kept when it is busy).
static RELOAD: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// Asks the running server to reload its certificate and key (SIGHUP).
pub fn request_reload() {
    RELOAD.notify_one();
}

/// A TLS record of type handshake starts with this byte; an HTTP request never does.
const HANDSHAKE_RECORD: u8 = 0x16;

/// A connection's TLS session after its handshake.
pub enum Session {
    /// rustls encrypts in user space.
    User(Box<UserTls>),
    /// The kernel encrypts: bodies go by sendfile.
    Kernel(Box<KernelTls>),
}

impl Session {
    /// `blobgate_tls_connections_total{mode}` and the access log's `tls`.
    pub fn mode(&self) -> &'static str {
        match self {
            Session::User(_) => "userspace",
            Session::Kernel(_) => "ktls",
        }
    }

    /// The user-space session, which writes through rustls; `None` for a kernel one, which sends as plain HTTP.
    pub fn user(&mut self) -> Option<&mut UserTls> {
        match self {
            Session::User(tls) => Some(tls),
            Session::Kernel(_) => None,
        }
    }

    /// Reads decrypted request bytes into `dst`; `Ok(0)` at the end.
    pub fn poll_read(&mut self, cx: &mut Context<'_>, stream: &TcpStream, dst: &mut [u8]) -> Poll<io::Result<usize>> {
        match self {
            Session::User(tls) => tls.poll_read(cx, stream, dst),
            Session::Kernel(tls) => tls.poll_read(cx, stream, dst),
        }
    }

    /// Ready once a read would find bytes (or the end).
    pub fn poll_readable(&mut self, cx: &mut Context<'_>, stream: &TcpStream) -> Poll<io::Result<()>> {
        match self {
            Session::User(tls) => tls.poll_readable(cx, stream),
            Session::Kernel(tls) => tls.poll_readable(cx, stream),
        }
    }

    /// A read now: `WouldBlock` when nothing can be read.
    pub fn try_read(&mut self, stream: &TcpStream, dst: &mut [u8]) -> io::Result<usize> {
        match self {
            Session::User(tls) => tls.read_plain(dst),
            Session::Kernel(tls) => tls.try_read(stream, dst),
        }
    }

    /// Sends close_notify, if the socket takes it now.
    pub fn close(&mut self, stream: &TcpStream) {
        match self {
            Session::User(tls) => tls.close(stream),
            Session::Kernel(tls) => tls.close(stream),
        }
    }
}

/// The configurations a handshake starts from, made together from one certificate pair.
struct Configs {
    userspace: Arc<ServerConfig>,
    /// Only the cipher suites the kernel has, with secret extraction on; `None` without kernel TLS.
    kernel: Option<Arc<ServerConfig>>,
    /// The suites of `kernel`, as ClientHello lists them.
    kernel_suites: Vec<u16>,
    /// The served certificate's notAfter, in seconds since the Unix epoch.
    not_after: u64,
}

/// Within this of its notAfter, loading a certificate logs a warning (the gauge is for alerting; this is for
/// whoever reads the log at a restart or reload).
const EXPIRY_WARNING: Duration = Duration::from_secs(14 * 24 * 3600);

impl Configs {
    /// Sets the expiry gauge to this pair's certificate, and warns when it has lapsed or soon will.
    fn publish_expiry(&self, cert: &Path) {
        crate::metrics::tls_certificate_expiry(self.not_after);
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs();
        let not_after = humantime::format_rfc3339_seconds(
            std::time::UNIX_EPOCH + Duration::from_secs(self.not_after.min(253_402_300_799)),
        );
        if self.not_after <= now {
            tracing::error!(cert = %cert.display(), %not_after, "the TLS certificate has expired; clients will refuse it");
        } else if self.not_after - now < EXPIRY_WARNING.as_secs() {
            tracing::warn!(cert = %cert.display(), %not_after, "the TLS certificate expires in less than 14 days");
        }
    }
}

/// The notAfter of a DER certificate, in seconds since the Unix epoch.
fn not_after(der: &CertificateDer<'_>) -> Result<u64, String> {
    use x509_cert::der::Decode as _;
    let cert = x509_cert::Certificate::from_der(der.as_ref()).map_err(|e| e.to_string())?;
    Ok(cert.tbs_certificate.validity.not_after.to_unix_duration().as_secs())
}

/// Reads and checks the certificate chain and key, and makes the configurations (`kernel_ciphers`: what the
/// kernel's TLS has).
fn load_pair(cert: &Path, key: &Path, kernel_ciphers: &[u16]) -> Result<Arc<Configs>, TlsConfigError> {
    let read = |name: &'static str, path: &Path| {
        std::fs::read(path).map_err(|source| TlsConfigError::Read { key: name, path: path.to_path_buf(), source })
    };
    let (cert_pem, key_pem) = (read("cert", cert)?, read("key", key)?);
    let chain = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsConfigError::BadCertificate { path: cert.to_path_buf(), reason: e.to_string() })?;
    let Some(leaf) = chain.first() else {
        return Err(TlsConfigError::NoCertificate { path: cert.to_path_buf() });
    };
    let not_after = not_after(leaf).map_err(|reason| TlsConfigError::BadCertificate {
        path: cert.to_path_buf(),
        reason: format!("its first certificate is not X.509 DER: {reason}"),
    })?;
    let private =
        PrivateKeyDer::from_pem_slice(&key_pem).map_err(|_| TlsConfigError::NoKey { path: key.to_path_buf() })?;
    let config = |provider: rustls::crypto::CryptoProvider| {
        let unusable = |e: rustls::Error| TlsConfigError::Unusable { path: key.to_path_buf(), reason: e.to_string() };
        let mut config = ServerConfig::builder_with_provider(Arc::new(provider))
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(unusable)?
            .with_no_client_auth()
            .with_single_cert(chain.clone(), private.clone_key())
            .map_err(|e| match e {
                rustls::Error::InconsistentKeys(_) => {
                    TlsConfigError::Mismatch { key: key.to_path_buf(), cert: cert.to_path_buf() }
                }
                other => unusable(other),
            })?;
        config.alpn_protocols = vec![ALPN_HTTP11.to_vec()];
        Ok::<_, TlsConfigError>(config)
    };
    let userspace = Arc::new(config(rustls::crypto::ring::default_provider())?);
    let mut provider = rustls::crypto::ring::default_provider();
    provider
        .cipher_suites
        .retain(|suite| ktls::kernel_cipher(suite.suite()).is_some_and(|c| kernel_ciphers.contains(&c)));
    let kernel_suites: Vec<u16> = provider.cipher_suites.iter().map(|suite| u16::from(suite.suite())).collect();
    let kernel = match kernel_suites.is_empty() {
        true => None,
        false => {
            let mut kernel = config(provider)?;
            kernel.enable_secret_extraction = true;
            Some(Arc::new(kernel))
        }
    };
    Ok(Arc::new(Configs { userspace, kernel, kernel_suites, not_after }))
}

/// A connection's TLS session when rustls encrypts and decrypts its records in user space.
pub struct UserTls {
    conn: ServerConnection,
    /// Plaintext of body regions on their way to rustls; empty between file bodies.
    body: Vec<u8>,
    /// The client closed its side of the TCP connection.
    eof: bool,
}

impl UserTls {
    /// Reads decrypted request bytes into `dst`: `Ok(0)` at the end (close_notify, or the TCP connection closed).
    pub fn poll_read(&mut self, cx: &mut Context<'_>, stream: &TcpStream, dst: &mut [u8]) -> Poll<io::Result<usize>> {
        loop {
            match self.read_plain(dst) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => ready!(self.poll_fill(cx, stream))?,
                done => return Poll::Ready(done),
            }
        }
    }

    /// Ready once decrypted bytes wait to be read, or the client has closed.
    pub fn poll_readable(&mut self, cx: &mut Context<'_>, stream: &TcpStream) -> Poll<io::Result<()>> {
        self.poll_fill(cx, stream)
    }

    /// Decrypted bytes already received: `WouldBlock` when none are, `Ok(0)` once the client has closed.
    pub fn read_plain(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        match self.conn.reader().read(dst) {
            // The TCP connection ended without close_notify: for HTTP/1.1 an end like any other (a truncated body
            // is caught by its framing).
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(0),
            other => other,
        }
    }

    /// Reads records from the socket until one yields plaintext, the peer closes, or the socket has nothing more.
    fn poll_fill(&mut self, cx: &mut Context<'_>, stream: &TcpStream) -> Poll<io::Result<()>> {
        loop {
            let state = self.conn.process_new_packets().map_err(|e| {
                let _ = self.conn.write_tls(&mut SocketIo(stream));
                io::Error::new(io::ErrorKind::InvalidData, e)
            })?;
            if state.plaintext_bytes_to_read() > 0 || state.peer_has_closed() || self.eof {
                return Poll::Ready(Ok(()));
            }
            ready!(stream.poll_read_ready(cx))?;
            match self.conn.read_tls(&mut SocketIo(stream)) {
                Ok(0) => self.eof = true,
                Ok(_) => {}
                // `try_read` cleared the readiness it saw: the next poll registers for the next edge.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
            // A record may want an answer (a key update, an alert): it goes now if the socket takes it, else with
            // the next response.
            if self.conn.wants_write() {
                let _ = self.conn.write_tls(&mut SocketIo(stream));
            }
        }
    }

    /// Encrypts `bytes`; unless `more` follows, sends everything pending.
    pub async fn send(
        &mut self,
        stream: &TcpStream,
        bytes: &[u8],
        more: bool,
        timeout: Duration,
    ) -> Result<(), SendOutcome> {
        self.conn.writer().write_all(bytes).map_err(SendOutcome::Aborted)?;
        if more { Ok(()) } else { flush(&mut self.conn, stream, timeout, 0).await }
    }

    /// Sends `head` and `body` encrypted: each region read into the connection's buffer a chunk at a time.
    /// `object_bytes` counts the body bytes whose records the socket took.
    pub async fn send_file_response(
        &mut self,
        stream: &TcpStream,
        head: &[u8],
        body: &FileBody,
        options: &SendOptions,
        observer: &impl SendObserver,
    ) -> SendReport {
        let mut report = SendReport { object_bytes: 0, sendfile_calls: 0, outcome: SendOutcome::Completed };
        if let Err(outcome) = self.send_segments(stream, head, body, options, observer, &mut report).await {
            report.outcome = outcome;
        }
        // Freed, not kept for the next body: kept, every idle keep-alive connection held its 128 KiB.
        self.body = Vec::new();
        report
    }

    async fn send_segments(
        &mut self,
        stream: &TcpStream,
        head: &[u8],
        body: &FileBody,
        options: &SendOptions,
        observer: &impl SendObserver,
        report: &mut SendReport,
    ) -> Result<(), SendOutcome> {
        let timeout = options.progress_timeout;
        self.conn.writer().write_all(head).map_err(SendOutcome::Aborted)?;
        for segment in &body.segments {
            match segment {
                Segment::Literal(bytes) => self.conn.writer().write_all(bytes).map_err(SendOutcome::Aborted)?,
                Segment::Region { offset, len } => {
                    let mut region = RegionCursor::new(body, *offset, *len);
                    // A large region takes its turns with other principals' on this worker, as on the sendfile path.
                    let mut turns = fair::Ready::new(body.share.filter(|_| *len >= send::FAIR_MIN));
                    loop {
                        // Not `while let`: its scrutinee's temporary would take room in this future for the whole
                        // loop body.
                        let Some(want) = region.next_chunk(BODY_CHUNK, timeout).await? else { break };
                        // A paced body reads and encrypts what its bandwidth grants, as the sendfile loop sends it.
                        let want = match body.pace.as_deref() {
                            Some(pace) => send::paced(pace, want, &mut turns).await,
                            None => want,
                        };
                        turns.turn().await;
                        let got = self.read_chunk(&body.file, region.position(), want, options, observer).await;
                        if let Some(pace) = body.pace.as_deref() {
                            pace.refund((want - *got.as_ref().unwrap_or(&0)) as u64);
                            observer.paced(pace.scope(), *got.as_ref().unwrap_or(&0) as u64);
                        }
                        let got = got?;
                        if got < want {
                            return Err(SendOutcome::Truncated { missing: region.remaining() - got as u64 });
                        }
                        self.conn.writer().write_all(&self.body[..got]).map_err(SendOutcome::Aborted)?;
                        flush_taking_turns(&mut self.conn, stream, timeout, options.min_download_rate, &mut turns)
                            .await?;
                        turns.sent(got as u64);
                        region.advance(got);
                        report.object_bytes += got as u64;
                        observer.sent(got as u64);
                        if region.remaining() > 0 {
                            tokio::task::yield_now().await;
                        }
                    }
                }
            }
        }
        flush(&mut self.conn, stream, timeout, options.min_download_rate).await
    }

    /// Reads `want` bytes of `file` at `position` into the body buffer (fewer only at the file's end): on the
    /// event loop when they are in the page cache, on the blocking pool when they must come from disk.
    async fn read_chunk(
        &mut self,
        file: &Arc<File>,
        position: u64,
        want: usize,
        options: &SendOptions,
        observer: &impl SendObserver,
    ) -> Result<usize, SendOutcome> {
        // Only as large as the region needs: a small body takes a small buffer.
        if self.body.len() < want {
            self.body.resize(want, 0);
        }
        if !send::chunk_is_cold(file, position, want as u64) {
            return read_full_at(file, &mut self.body[..want], position).map_err(SendOutcome::Aborted);
        }
        observer.cold_chunk();
        let _permit =
            options.pool_sends.clone().acquire_owned().await.map_err(|e| SendOutcome::Aborted(io::Error::other(e)))?;
        let (file, mut buffer) = (file.clone(), std::mem::take(&mut self.body));
        let (buffer, read) = tokio::task::spawn_blocking(move || {
            let read = read_full_at(&file, &mut buffer[..want], position);
            (buffer, read)
        })
        .await
        .map_err(|e| SendOutcome::Aborted(io::Error::other(e)))?;
        self.body = buffer;
        read.map_err(SendOutcome::Aborted)
    }

    /// Sends close_notify if the socket takes it now (the connection is closing either way).
    pub fn close(&mut self, stream: &TcpStream) {
        self.conn.send_close_notify();
        let _ = self.conn.write_tls(&mut SocketIo(stream));
    }
}

/// `pread` until `buf` is full or the file ends; returns the bytes read.
fn read_full_at(file: &File, buf: &mut [u8], position: u64) -> io::Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut filled = 0;
    while filled < buf.len() {
        match file.read_at(&mut buf[filled..], position + filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Sends every record rustls holds, waiting for the socket as a send does (an object body's with its pauses
/// excused as `send::wait_writable_paced` does, at `min_rate`).
async fn flush(
    conn: &mut ServerConnection,
    stream: &TcpStream,
    timeout: Duration,
    min_rate: u64,
) -> Result<(), SendOutcome> {
    flush_taking_turns(conn, stream, timeout, min_rate, &mut fair::Ready::new(None)).await
}

/// [`flush`] for a body region that takes turns: not ready for one while it waits for its client.
async fn flush_taking_turns(
    conn: &mut ServerConnection,
    stream: &TcpStream,
    timeout: Duration,
    min_rate: u64,
    turns: &mut fair::Ready,
) -> Result<(), SendOutcome> {
    while conn.wants_write() {
        match conn.write_tls(&mut SocketIo(stream)) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                turns.pause();
                send::wait_writable_paced(stream, timeout, min_rate).await?;
                turns.resume();
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(SendOutcome::Aborted(e)),
        }
    }
    Ok(())
}

/// The socket as `std::io` for rustls, through tokio's non-blocking calls: `WouldBlock` clears tokio's readiness.
struct SocketIo<'a>(&'a TcpStream);

impl io::Read for SocketIo<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.try_read(buf)
    }
}

impl io::Write for SocketIo<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.try_write(buf)
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        self.0.try_write_vectored(bufs)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_failure_has_its_own_label() {
        let labels: std::collections::HashSet<_> = HandshakeFailure::ALL.iter().map(|f| f.label()).collect();
        assert_eq!(labels.len(), HandshakeFailure::ALL.len());
    }
}
