//! The floor of relaying bytes over TLS, measured in the bench's own run: what no relay can
//! avoid spending per GiB on this machine.
//!
//! - `crypto`: decrypting each TLS record once as it arrives and encrypting it once for the
//!   other side: the record cipher of the suite rustls negotiates here (as relaylet does with the
//!   bench's clients and leaf), called directly, 16 KiB records, nothing else.
//! - `rustls`: the same through whole in-memory rustls connections (their buffering and copies
//!   included), for reference: what a relay built on rustls' `Read`/`Write` cannot go below.
//! - `tcp`: a plain-TCP splice on loopback (read into a buffer, write it on), for the kernel's
//!   share: the two socket copies and their system calls.
//!
//! Both are the CPU time of the one thread doing the relay's work.

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// CPU seconds per GiB of the two parts of the floor, and the rustls reference.
#[derive(Debug, Clone)]
pub struct Floor {
    pub crypto: f64,
    pub tcp: f64,
    pub rustls: f64,
    /// The cipher suite measured.
    pub suite: String,
}

impl Floor {
    pub fn total(&self) -> f64 {
        self.crypto + self.tcp
    }
}

/// Chunk size of the relay's reads and writes: a TLS record's plaintext.
const CHUNK: usize = 16 * 1024;

/// Measures both parts over `bytes` bytes (blocking; run it off the async threads).
pub fn measure(bytes: u64) -> anyhow::Result<Floor> {
    let (cipher, suite) = record_cipher(bytes)?;
    Ok(Floor {
        crypto: per_gib(cipher, bytes),
        tcp: per_gib(tcp(bytes)?, bytes),
        rustls: per_gib(crypto(bytes)?, bytes),
        suite,
    })
}

/// One decryption and one encryption of every 16 KiB record with the negotiated suite's record
/// cipher.
fn record_cipher(bytes: u64) -> anyhow::Result<(Duration, String)> {
    use rustls::crypto::cipher::{
        AeadKey, InboundOpaqueMessage, Iv, OutboundChunks, OutboundPlainMessage,
    };
    use rustls::{ContentType, ProtocolVersion};
    let (client, _server) = pair()?;
    let suite = client
        .negotiated_cipher_suite()
        .context("no cipher suite negotiated")?;
    let name = format!("{:?}", suite.suite());
    let rustls::SupportedCipherSuite::Tls13(tls13) = suite else {
        anyhow::bail!("{name}: not a TLS 1.3 suite");
    };
    // rustls takes whole 32-byte keys from outside; AES-128 suites would need 16.
    anyhow::ensure!(
        tls13.aead_alg.key_len() == 32,
        "{name}: the floor measures 256-bit record ciphers only"
    );
    let mut seal = tls13
        .aead_alg
        .encrypter(AeadKey::from([7u8; 32]), Iv::from([1u8; 12]));
    let mut open = tls13
        .aead_alg
        .decrypter(AeadKey::from([7u8; 32]), Iv::from([1u8; 12]));
    let plain = vec![0u8; CHUNK];
    let start = thread_cpu()?;
    let mut left = bytes;
    let mut seq = 0u64;
    while left > 0 {
        let n = CHUNK.min(usize::try_from(left).unwrap_or(CHUNK));
        let sealed = seal.encrypt(
            OutboundPlainMessage {
                typ: ContentType::ApplicationData,
                version: ProtocolVersion::TLSv1_2,
                payload: OutboundChunks::Single(&plain[..n]),
            },
            seq,
        )?;
        let mut wire = sealed.encode();
        let opened = open.decrypt(
            InboundOpaqueMessage::new(
                ContentType::ApplicationData,
                ProtocolVersion::TLSv1_2,
                &mut wire[5..],
            ),
            seq,
        )?;
        anyhow::ensure!(opened.payload.len() == n, "a record did not round-trip");
        left -= n as u64;
        seq += 1;
    }
    Ok((thread_cpu()?.saturating_sub(start), name))
}

fn per_gib(cpu: Duration, bytes: u64) -> f64 {
    cpu.as_secs_f64() / (bytes as f64 / (1u64 << 30) as f64)
}

/// The calling thread's CPU time. `CLOCK_THREAD_CPUTIME_ID` brings the kernel's account up to
/// date when read (a thread's `schedstat` only moves at scheduler events, too coarse for one
/// busy thread); it counts the same thing, time on a CPU.
fn thread_cpu() -> anyhow::Result<Duration> {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .context("clock_gettime(CLOCK_THREAD_CPUTIME_ID)")?;
    Ok(Duration::from(t))
}

/// A connected in-memory TLS pair, handshake done.
fn pair() -> anyhow::Result<(rustls::ClientConnection, rustls::ServerConnection)> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let key = rcgen::KeyPair::generate()?;
    let cert = rcgen::CertificateParams::new(vec!["floor".to_string()])?.self_signed(&key)?;
    let der = CertificateDer::from(cert.der().to_vec());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(der.clone())?;
    let server = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(
            vec![der],
            PrivateKeyDer::try_from(key.serialize_der()).map_err(anyhow::Error::msg)?,
        )?;
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut c = rustls::ClientConnection::new(Arc::new(client), ServerName::try_from("floor")?)?;
    let mut s = rustls::ServerConnection::new(Arc::new(server))?;
    while c.is_handshaking() || s.is_handshaking() {
        shuttle(&mut c, &mut s)?;
        shuttle(&mut s, &mut c)?;
    }
    // Session tickets and the like.
    shuttle(&mut s, &mut c)?;
    Ok((c, s))
}

/// Moves every pending TLS byte from `from` to `to` and lets `to` process it.
fn shuttle<A, B, DA, DB>(from: &mut A, to: &mut B) -> anyhow::Result<()>
where
    A: std::ops::DerefMut<Target = rustls::ConnectionCommon<DA>>,
    B: std::ops::DerefMut<Target = rustls::ConnectionCommon<DB>>,
{
    let mut wire = Vec::new();
    while from.wants_write() {
        from.write_tls(&mut wire)?;
    }
    let mut cursor = &wire[..];
    while !cursor.is_empty() {
        to.read_tls(&mut cursor)?;
        to.process_new_packets()?;
    }
    Ok(())
}

/// The relay's rustls work for `bytes`: as the TLS client of the leaf it decrypts, as the TLS server
/// of the root apiserver it encrypts (the exec-stdout direction).
fn crypto(bytes: u64) -> anyhow::Result<Duration> {
    // The leaf's records, made before the clock starts.
    let (mut relay_in, mut leaf) = pair()?;
    let plain = vec![0u8; CHUNK];
    let mut records = Vec::new();
    let mut left = bytes;
    while left > 0 {
        let n = CHUNK.min(usize::try_from(left).unwrap_or(CHUNK));
        leaf.writer().write_all(&plain[..n])?;
        while leaf.wants_write() {
            leaf.write_tls(&mut records)?;
        }
        left -= n as u64;
    }
    let (_root, mut relay_out) = pair()?;

    let start = thread_cpu()?;
    let mut cursor = &records[..];
    let mut buf = vec![0u8; CHUNK];
    let mut out = Vec::with_capacity(CHUNK + 64);
    let mut moved = 0u64;
    while moved < bytes {
        anyhow::ensure!(
            !cursor.is_empty(),
            "the crypto floor decrypted {moved} of {bytes} bytes"
        );
        relay_in.read_tls(&mut cursor)?;
        relay_in.process_new_packets()?;
        loop {
            let n = match relay_in.reader().read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e.into()),
            };
            relay_out.writer().write_all(&buf[..n])?;
            while relay_out.wants_write() {
                out.clear();
                relay_out.write_tls(&mut out)?;
            }
            moved += n as u64;
        }
    }
    let used = thread_cpu()?.saturating_sub(start);
    std::hint::black_box(&out);
    Ok(used)
}

/// A plain-TCP splice of `bytes` on loopback: the relay thread's CPU.
fn tcp(bytes: u64) -> anyhow::Result<Duration> {
    let a = std::net::TcpListener::bind("127.0.0.1:0")?;
    let b = std::net::TcpListener::bind("127.0.0.1:0")?;
    let (a_addr, b_addr) = (a.local_addr()?, b.local_addr()?);
    let sender = std::thread::spawn(move || -> std::io::Result<()> {
        let mut s = std::net::TcpStream::connect(a_addr)?;
        let chunk = vec![0u8; CHUNK * 4];
        let mut left = bytes;
        while left > 0 {
            let n = chunk
                .len()
                .min(usize::try_from(left).unwrap_or(chunk.len()));
            s.write_all(&chunk[..n])?;
            left -= n as u64;
        }
        Ok(())
    });
    let receiver = std::thread::spawn(move || -> std::io::Result<u64> {
        let (mut s, _) = b.accept()?;
        let mut buf = vec![0u8; CHUNK * 4];
        let mut got = 0u64;
        loop {
            match s.read(&mut buf)? {
                0 => return Ok(got),
                n => got += n as u64,
            }
        }
    });
    let (mut from, _) = a.accept()?;
    let mut to = std::net::TcpStream::connect(b_addr)?;
    let start = thread_cpu()?;
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = from.read(&mut buf)?;
        if n == 0 {
            break;
        }
        to.write_all(&buf[..n])?;
    }
    let used = thread_cpu()?.saturating_sub(start);
    drop(to);
    sender
        .join()
        .map_err(|_| anyhow::anyhow!("floor sender panicked"))??;
    let got = receiver
        .join()
        .map_err(|_| anyhow::anyhow!("floor receiver panicked"))??;
    anyhow::ensure!(got == bytes, "the TCP floor moved {got} of {bytes} bytes");
    Ok(used)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both parts relay every byte (each checks it moved exactly `bytes`, or fails).
    #[test]
    fn the_floor_relays_every_byte() {
        let floor = measure(4 << 20).unwrap();
        assert!(floor.suite.starts_with("TLS13_"), "{floor:?}");
    }
}
