//! Kernel TLS: a handshake whose session goes to the kernel, after which heads go by `send` and bodies by
//! `sendfile` exactly as on plain HTTP, and the kernel encrypts them (and decrypts requests).
//!
//! rustls runs the handshake (its unbuffered API, which can hand the session over) and keeps what the kernel cannot
//! do: new receive keys after a TLS 1.3 KeyUpdate. The handshake reads the socket one TLS record at a time, so
//! nothing after the client's Finished (its first request, already encrypted under the session keys) is taken from
//! the socket before the kernel holds the keys that decrypt it. The socket options, `recvmsg` and `sendmsg` are
//! in `sys.rs`, the driver's one module that touches raw fds; the pure parts (which cipher suites a ClientHello offers,
//! the keys as the kernel takes them) are here and unit-tested.

use std::io;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use rustls::kernel::KernelConnection;
use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{ConnectionState, EncodeError, UnbufferedStatus};
use rustls::{ConnectionTrafficSecrets, ProtocolVersion, ServerConfig};
use tokio::io::Interest;
use tokio::net::TcpStream;

use super::send;
use super::sys::{self, KernelTlsRead, TlsCryptoInfo};
use super::tls::HandshakeFailure;

/// kTLS cipher types (`TLS_CIPHER_*`) the kernel may have: AES-GCM-128, AES-GCM-256, ChaCha20-Poly1305.
pub const KERNEL_CIPHERS: [u16; 3] =
    [libc::TLS_CIPHER_AES_GCM_128, libc::TLS_CIPHER_AES_GCM_256, libc::TLS_CIPHER_CHACHA20_POLY1305];

/// The kTLS cipher type a cipher suite's records use, if the kernel can have one.
pub fn kernel_cipher(suite: rustls::CipherSuite) -> Option<u16> {
    use rustls::CipherSuite as C;
    match suite {
        C::TLS13_AES_128_GCM_SHA256
        | C::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
        | C::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 => Some(libc::TLS_CIPHER_AES_GCM_128),
        C::TLS13_AES_256_GCM_SHA384
        | C::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384
        | C::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384 => Some(libc::TLS_CIPHER_AES_GCM_256),
        C::TLS13_CHACHA20_POLY1305_SHA256
        | C::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
        | C::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256 => Some(libc::TLS_CIPHER_CHACHA20_POLY1305),
        _ => None,
    }
}

/// What the first bytes of a connection say about the client's cipher suites.
#[derive(Debug, PartialEq, Eq)]
pub enum Hello {
    /// The suites a complete ClientHello offers, in its order.
    Suites(Vec<u16>),
    /// The ClientHello has not all arrived yet.
    NeedMore,
    /// Not a ClientHello in one record (the handshake then decides what it is).
    Other,
}

/// Reads the cipher suites from the start of a ClientHello: record header, handshake header, version, random,
/// session id, then the suites (nothing after them is needed).
pub fn offered_suites(bytes: &[u8]) -> Hello {
    const HEADER: usize = 5;
    if bytes.len() < HEADER {
        return Hello::NeedMore;
    }
    if bytes[0] != 0x16 {
        return Hello::Other;
    }
    let record_len = u16::from_be_bytes([bytes[3], bytes[4]]) as usize;
    let record = &bytes[HEADER..bytes.len().min(HEADER + record_len)];
    let complete = record.len() == record_len;
    let short = || if complete { Hello::Other } else { Hello::NeedMore };
    // Handshake type 1 (ClientHello) and 3 length bytes, version (2), random (32).
    let mut at = 4 + 2 + 32;
    if record.first().is_some_and(|&kind| kind != 1) {
        return Hello::Other;
    }
    let Some(&session_id_len) = record.get(at) else { return short() };
    at += 1 + session_id_len as usize;
    let Some(suites_len) = record.get(at..at + 2).map(|b| u16::from_be_bytes([b[0], b[1]]) as usize) else {
        return short();
    };
    at += 2;
    let Some(suites) = record.get(at..at + suites_len) else { return short() };
    if suites_len % 2 != 0 {
        return Hello::Other;
    }
    Hello::Suites(suites.chunks_exact(2).map(|pair| u16::from_be_bytes([pair[0], pair[1]])).collect())
}

/// One direction's keys as the kernel takes them; `None` for a version or cipher the kernel has no form for.
pub fn crypto_info(version: ProtocolVersion, seq: u64, secrets: ConnectionTrafficSecrets) -> Option<TlsCryptoInfo> {
    let version = match version {
        ProtocolVersion::TLSv1_2 => libc::TLS_1_2_VERSION,
        ProtocolVersion::TLSv1_3 => libc::TLS_1_3_VERSION,
        _ => return None,
    };
    let rec_seq = seq.to_be_bytes();
    let info = |cipher_type| libc::tls_crypto_info { version, cipher_type };
    // The AEAD's 12-byte nonce base: for GCM the kernel takes its first 4 bytes as the salt and the rest as the iv.
    Some(match secrets {
        ConnectionTrafficSecrets::Aes128Gcm { key, iv } => {
            let (salt, iv) = iv.as_ref().split_at(4);
            TlsCryptoInfo::Aes128Gcm(libc::tls12_crypto_info_aes_gcm_128 {
                info: info(libc::TLS_CIPHER_AES_GCM_128),
                iv: iv.try_into().ok()?,
                key: key.as_ref().try_into().ok()?,
                salt: salt.try_into().ok()?,
                rec_seq,
            })
        }
        ConnectionTrafficSecrets::Aes256Gcm { key, iv } => {
            let (salt, iv) = iv.as_ref().split_at(4);
            TlsCryptoInfo::Aes256Gcm(libc::tls12_crypto_info_aes_gcm_256 {
                info: info(libc::TLS_CIPHER_AES_GCM_256),
                iv: iv.try_into().ok()?,
                key: key.as_ref().try_into().ok()?,
                salt: salt.try_into().ok()?,
                rec_seq,
            })
        }
        ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
            TlsCryptoInfo::Chacha20Poly1305(libc::tls12_crypto_info_chacha20_poly1305 {
                info: info(libc::TLS_CIPHER_CHACHA20_POLY1305),
                iv: iv.as_ref().try_into().ok()?,
                key: key.as_ref().try_into().ok()?,
                salt: [],
                rec_seq,
            })
        }
        _ => return None,
    })
}

/// TLS 1.3 keys of kTLS cipher type `cipher`, all zero: only for asking the kernel whether it has the cipher.
pub fn zero_key_info(cipher: u16) -> Option<TlsCryptoInfo> {
    let info = libc::tls_crypto_info { version: libc::TLS_1_3_VERSION, cipher_type: cipher };
    let rec_seq = [0; 8];
    Some(match cipher {
        libc::TLS_CIPHER_AES_GCM_128 => TlsCryptoInfo::Aes128Gcm(libc::tls12_crypto_info_aes_gcm_128 {
            info,
            iv: [0; 8],
            key: [0; 16],
            salt: [0; 4],
            rec_seq,
        }),
        libc::TLS_CIPHER_AES_GCM_256 => TlsCryptoInfo::Aes256Gcm(libc::tls12_crypto_info_aes_gcm_256 {
            info,
            iv: [0; 8],
            key: [0; 32],
            salt: [0; 4],
            rec_seq,
        }),
        libc::TLS_CIPHER_CHACHA20_POLY1305 => {
            TlsCryptoInfo::Chacha20Poly1305(libc::tls12_crypto_info_chacha20_poly1305 {
                info,
                iv: [0; 12],
                key: [0; 32],
                salt: [],
                rec_seq,
            })
        }
        _ => return None,
    })
}

/// Reads the connection's first TLS record (the ClientHello, whose suites then choose kernel or user-space TLS):
/// the record's bytes, for whichever handshake follows, and what it offers.
pub async fn read_hello(stream: &TcpStream) -> Result<(Vec<u8>, Hello), HandshakeFailure> {
    let mut record = Vec::new();
    read_record(stream, &mut record).await?;
    let hello = offered_suites(&record);
    Ok((record, hello))
}

/// Runs a handshake with `config` (whose suites the kernel has), starting from `first`, the records already read
/// (the ClientHello), and hands the session to the kernel.
pub async fn handshake(
    stream: &TcpStream,
    config: Arc<ServerConfig>,
    send_timeout: Duration,
    first: Vec<u8>,
) -> Result<Box<KernelTls>, HandshakeFailure> {
    let mut conn = UnbufferedServerConnection::new(config).map_err(|_| HandshakeFailure::Malformed)?;
    // Whole records only, read one at a time (see the module doc).
    let mut incoming: Vec<u8> = first;
    let mut outgoing: Vec<u8> = vec![0; 4096];
    let mut pending = 0;
    loop {
        let UnbufferedStatus { discard, state } = conn.process_tls_records(&mut incoming);
        let mut step = Step::Go;
        match state.map_err(|e| HandshakeFailure::of(&e))? {
            ConnectionState::EncodeTlsData(mut encoding) => loop {
                match encoding.encode(&mut outgoing[pending..]) {
                    Ok(written) => {
                        pending += written;
                        break;
                    }
                    Err(EncodeError::InsufficientSize(size)) => outgoing.resize(pending + size.required_size, 0),
                    Err(_) => return Err(HandshakeFailure::Malformed),
                }
            },
            ConnectionState::TransmitTlsData(transmit) => {
                send::send_bytes(stream, &outgoing[..pending], false, send_timeout)
                    .await
                    .map_err(|_| HandshakeFailure::Io)?;
                pending = 0;
                transmit.done();
            }
            ConnectionState::BlockedHandshake => step = Step::Read,
            ConnectionState::WriteTraffic(_) => step = Step::Done,
            ConnectionState::PeerClosed | ConnectionState::Closed => return Err(HandshakeFailure::Closed),
            // Application data before the handshake finished (0-RTT is not enabled), or a state rustls adds later.
            _ => return Err(HandshakeFailure::Malformed),
        }
        incoming.drain(..discard);
        match step {
            Step::Go => {}
            Step::Read => read_record(stream, &mut incoming).await?,
            Step::Done => break,
        }
    }
    if !incoming.is_empty() || pending != 0 {
        return Err(HandshakeFailure::Malformed);
    }
    let (secrets, session) = conn.dangerous_into_kernel_connection().map_err(|_| HandshakeFailure::KernelRefused)?;
    let version = session.protocol_version();
    let (tx_seq, tx) = secrets.tx;
    let (rx_seq, rx) = secrets.rx;
    let (Some(tx), Some(rx)) = (crypto_info(version, tx_seq, tx), crypto_info(version, rx_seq, rx)) else {
        return Err(HandshakeFailure::KernelRefused);
    };
    sys::install_kernel_tls(stream, &tx, &rx).map_err(|e| {
        tracing::warn!(error = %e, "the kernel refused a TLS session's keys; closing the connection");
        HandshakeFailure::KernelRefused
    })?;
    Ok(Box::new(KernelTls { session, version, closed: false }))
}

enum Step {
    Go,
    Read,
    Done,
}

/// Appends exactly one TLS record from the socket to `incoming`.
async fn read_record(stream: &TcpStream, incoming: &mut Vec<u8>) -> Result<(), HandshakeFailure> {
    let start = incoming.len();
    read_exact(stream, incoming, 5).await?;
    let len = u16::from_be_bytes([incoming[start + 3], incoming[start + 4]]) as usize;
    // A TLS record is at most 2^14 bytes of plaintext plus 2048 of expansion.
    if len > (1 << 14) + 2048 {
        return Err(HandshakeFailure::Malformed);
    }
    read_exact(stream, incoming, len).await
}

async fn read_exact(stream: &TcpStream, into: &mut Vec<u8>, mut want: usize) -> Result<(), HandshakeFailure> {
    let mut buf = [0u8; 4096];
    while want > 0 {
        stream.readable().await.map_err(|_| HandshakeFailure::Io)?;
        let take = want.min(buf.len());
        match stream.try_read(&mut buf[..take]) {
            Ok(0) => return Err(HandshakeFailure::Closed),
            Ok(n) => {
                into.extend_from_slice(&buf[..n]);
                want -= n;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => return Err(HandshakeFailure::Io),
        }
    }
    Ok(())
}

/// A connection whose records the kernel encrypts and decrypts.
pub struct KernelTls {
    session: KernelConnection<ServerConnectionData>,
    version: ProtocolVersion,
    /// The client sent close_notify.
    closed: bool,
}

/// TLS content types and the alert and handshake messages the kernel hands back to us.
const ALERT: u8 = 21;
const HANDSHAKE: u8 = 22;
const CLOSE_NOTIFY: u8 = 0;
const KEY_UPDATE: u8 = 24;

impl KernelTls {
    /// Reads decrypted request bytes into `dst`; `Ok(0)` at the end (close_notify or the TCP connection closed).
    /// Control records are handled here: alerts end the connection, a KeyUpdate takes new receive keys when the
    /// kernel can (else the connection ends, counted).
    pub fn poll_read(&mut self, cx: &mut Context<'_>, stream: &TcpStream, dst: &mut [u8]) -> Poll<io::Result<usize>> {
        loop {
            if self.closed {
                return Poll::Ready(Ok(0));
            }
            ready!(stream.poll_read_ready(cx))?;
            match stream.try_io(Interest::READABLE, || sys::recv_kernel_tls(stream, dst)) {
                Ok(KernelTlsRead::Data(n)) => return Poll::Ready(Ok(n)),
                Ok(KernelTlsRead::Control { record_type, len }) => {
                    if let Err(e) = self.control(stream, record_type, &dst[..len]) {
                        return Poll::Ready(Err(e));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    /// Ready once a read would find bytes (or the end).
    pub fn poll_readable(&mut self, cx: &mut Context<'_>, stream: &TcpStream) -> Poll<io::Result<()>> {
        if self.closed {
            return Poll::Ready(Ok(()));
        }
        stream.poll_read_ready(cx)
    }

    /// A read now: `WouldBlock` when nothing has arrived.
    pub fn try_read(&mut self, stream: &TcpStream, dst: &mut [u8]) -> io::Result<usize> {
        let waker = std::task::Waker::noop();
        match self.poll_read(&mut Context::from_waker(waker), stream, dst) {
            Poll::Ready(read) => read,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    fn control(&mut self, stream: &TcpStream, record_type: u8, record: &[u8]) -> io::Result<()> {
        match (record_type, record) {
            (ALERT, [_, CLOSE_NOTIFY]) => {
                self.closed = true;
                Ok(())
            }
            (ALERT, [_, description]) => Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                format!("the client sent TLS alert {description}"),
            )),
            (HANDSHAKE, [KEY_UPDATE, 0, 0, 1, request]) if self.version == ProtocolVersion::TLSv1_3 => {
                self.key_update(stream, *request == 1)
            }
            (kind, _) => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("unexpected TLS record of type {kind} after the handshake"),
            )),
        }
    }

    /// The client's TLS 1.3 KeyUpdate: its next records use new keys, which the kernel needs before it can read
    /// them. A client that asks for our keys to change too would need a KeyUpdate sent under the old keys and new
    /// transmit keys installed; the connection ends there instead, as it does where the kernel cannot rekey.
    fn key_update(&mut self, stream: &TcpStream, update_requested: bool) -> io::Result<()> {
        let refused = |why: String| {
            crate::metrics::tls_key_update_closed();
            io::Error::other(why)
        };
        let (seq, secrets) = self.session.update_rx_secret().map_err(|e| refused(e.to_string()))?;
        let rx =
            crypto_info(self.version, seq, secrets).ok_or_else(|| refused("no kernel form for the keys".into()))?;
        sys::rekey_kernel_tls_rx(stream, &rx)
            .map_err(|e| refused(format!("the kernel cannot take new receive keys: {e}")))?;
        if update_requested {
            return Err(refused("the client asked for new transmit keys".into()));
        }
        Ok(())
    }

    /// Sends close_notify if the socket takes it now.
    pub fn close(&mut self, stream: &TcpStream) {
        let _ = sys::send_kernel_tls_record(stream, ALERT, &[1, CLOSE_NOTIFY]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_cipher_has_zero_keys_to_probe_with_and_nothing_else_does() {
        for cipher in KERNEL_CIPHERS {
            let probe = zero_key_info(cipher).expect("a probe");
            let kind = match probe {
                TlsCryptoInfo::Aes128Gcm(info) => info.info.cipher_type,
                TlsCryptoInfo::Aes256Gcm(info) => info.info.cipher_type,
                TlsCryptoInfo::Chacha20Poly1305(info) => info.info.cipher_type,
            };
            assert_eq!(kind, cipher);
        }
        assert!(zero_key_info(0).is_none());
    }

    /// A ClientHello's first bytes: record and handshake headers, version, random, a session id, the suites.
    fn client_hello(session_id: &[u8], suites: &[u16], extra: &[u8]) -> Vec<u8> {
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7; 32]);
        body.push(session_id.len() as u8);
        body.extend_from_slice(session_id);
        body.extend_from_slice(&((suites.len() * 2) as u16).to_be_bytes());
        for suite in suites {
            body.extend_from_slice(&suite.to_be_bytes());
        }
        body.extend_from_slice(extra);
        let mut handshake = vec![1, 0, (body.len() >> 8) as u8, body.len() as u8];
        handshake.extend_from_slice(&body);
        let mut record = vec![0x16, 3, 1];
        record.extend_from_slice(&(handshake.len() as u16).to_be_bytes());
        record.extend_from_slice(&handshake);
        record
    }

    #[test]
    fn the_suites_of_a_client_hello_are_read_from_any_prefix() {
        let hello = client_hello(&[9; 32], &[0x1301, 0x1303, 0xc02b], &[0, 1, 0, 0xff, 0xff]);
        assert_eq!(offered_suites(&hello), Hello::Suites(vec![0x1301, 0x1303, 0xc02b]));
        // Every shorter prefix that ends before the suites asks for more; none is misread.
        let suites_end = 5 + 4 + 2 + 32 + 1 + 32 + 2 + 6;
        for cut in 0..suites_end {
            assert_eq!(offered_suites(&hello[..cut]), Hello::NeedMore, "cut at {cut}");
        }
        for cut in suites_end..hello.len() {
            assert_eq!(offered_suites(&hello[..cut]), Hello::Suites(vec![0x1301, 0x1303, 0xc02b]));
        }
        assert_eq!(offered_suites(&client_hello(&[], &[0x1302], &[])), Hello::Suites(vec![0x1302]));
    }

    #[test]
    fn what_is_not_a_client_hello_in_one_record_is_other() {
        assert_eq!(offered_suites(b"GET / HTTP/1.1\r\n"), Hello::Other);
        let mut hello = client_hello(&[], &[0x1301], &[]);
        hello[5] = 2; // a ServerHello
        assert_eq!(offered_suites(&hello), Hello::Other);
        // A record that ends inside the suites: the hello spans records.
        let mut split = client_hello(&[], &[0x1301, 0x1302], &[]);
        let short = (split.len() - 5 - 2) as u16;
        split[3..5].copy_from_slice(&short.to_be_bytes());
        assert_eq!(offered_suites(&split), Hello::Other);
    }

    #[test]
    fn keys_take_the_kernel_layout() {
        use rustls::crypto::cipher::{AeadKey, Iv};
        let iv: [u8; 12] = std::array::from_fn(|i| i as u8);
        let key: [u8; 32] = std::array::from_fn(|i| 100 + i as u8);
        let secrets = ConnectionTrafficSecrets::Aes256Gcm { key: AeadKey::from(key), iv: Iv::new(iv) };
        let Some(TlsCryptoInfo::Aes256Gcm(info)) = crypto_info(ProtocolVersion::TLSv1_3, 5, secrets) else {
            panic!("AES-256-GCM has a kernel form");
        };
        assert_eq!((info.info.version, info.info.cipher_type), (libc::TLS_1_3_VERSION, libc::TLS_CIPHER_AES_GCM_256));
        assert_eq!(info.salt, [0, 1, 2, 3]);
        assert_eq!(info.iv, [4, 5, 6, 7, 8, 9, 10, 11]);
        assert_eq!(info.key, key);
        assert_eq!(info.rec_seq, [0, 0, 0, 0, 0, 0, 0, 5]);
        let secrets = ConnectionTrafficSecrets::Chacha20Poly1305 { key: AeadKey::from(key), iv: Iv::new(iv) };
        let Some(TlsCryptoInfo::Chacha20Poly1305(info)) = crypto_info(ProtocolVersion::TLSv1_2, 1 << 40, secrets)
        else {
            panic!("ChaCha20-Poly1305 has a kernel form");
        };
        assert_eq!(info.info.version, libc::TLS_1_2_VERSION);
        assert_eq!((info.iv, info.key), (iv, key));
        assert_eq!(info.rec_seq, (1u64 << 40).to_be_bytes());
    }

    #[test]
    fn every_kernel_cipher_has_suites_and_others_have_none() {
        for cipher in KERNEL_CIPHERS {
            let suites = rustls::crypto::ring::default_provider().cipher_suites;
            assert!(suites.iter().any(|s| kernel_cipher(s.suite()) == Some(cipher)), "{cipher}");
        }
        assert_eq!(kernel_cipher(rustls::CipherSuite::TLS_RSA_WITH_AES_128_CBC_SHA), None);
    }
}
