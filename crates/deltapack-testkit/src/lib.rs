//! # deltapack-testkit — support for deltapack's tests
//!
//! Not part of the product (`publish = false`): what the test suites of the
//! store and the CLI share to put real components under faults.
//!
//! [`FaultProxy`] is a TCP proxy to put between a client (a ledger
//! connection, an S3 client) and a real server. It forwards bytes as they
//! come until a test switches its [`Fault`]: then every connection, open
//! or new, is black-holed (bytes swallowed, nothing answered — a hung
//! server or a black-holed load balancer), delayed, cut (both directions
//! shut down), or half-closed (the client reads end-of-stream while its
//! own writes still go through). Switched back to [`Fault::None`], new
//! connections work again; connections that were cut or half-closed stay
//! so, as they would after a real fault.
//!
//! It is std only (a thread per direction per connection): fine for the
//! handful of connections a test opens, and free of any runtime a test
//! might be running or shutting down.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the proxy does to the traffic it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Forward every byte at once.
    None,
    /// Accept connections and swallow every byte: nothing reaches the
    /// server, nothing comes back.
    BlackHole,
    /// Forward every chunk after this delay.
    Delay(Duration),
    /// Shut down both directions of every connection (the client reads
    /// end-of-stream and its writes fail); new connections are closed at
    /// once.
    Cut,
    /// Shut down the direction towards the client only: it reads
    /// end-of-stream, its writes still reach the server.
    HalfClose,
}

/// A TCP proxy on 127.0.0.1 in front of `upstream`, whose fault a test
/// switches at any moment ([`FaultProxy::set`]). Stops accepting when
/// dropped.
pub struct FaultProxy {
    addr: SocketAddr,
    state: Arc<State>,
}

struct State {
    fault: Mutex<Fault>,
    stopped: AtomicBool,
    accepted: AtomicU64,
    /// Bytes forwarded from the server to clients.
    to_clients: AtomicU64,
    /// Both sockets of every open connection (by id), for faults that act
    /// on them; removed when both directions of the connection ended, so
    /// a long run does not hold a socket per connection it ever carried.
    open: Mutex<Vec<(u64, TcpStream, TcpStream)>>,
}

impl State {
    fn fault(&self) -> Fault {
        *self.fault.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl FaultProxy {
    /// Starts a proxy to `upstream` (e.g. `127.0.0.1:5432`), forwarding.
    pub fn start(upstream: SocketAddr) -> std::io::Result<FaultProxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State {
            fault: Mutex::new(Fault::None),
            stopped: AtomicBool::new(false),
            accepted: AtomicU64::new(0),
            to_clients: AtomicU64::new(0),
            open: Mutex::new(Vec::new()),
        });
        let s = state.clone();
        std::thread::Builder::new()
            .name("fault-proxy".into())
            .spawn(move || accept_loop(listener, upstream, s))?;
        Ok(FaultProxy { addr, state })
    }

    /// A listener that accepts every connection and never answers (a hung
    /// server, a black-holed load balancer): a proxy black-holed from the
    /// start, in front of nothing it ever connects to.
    pub fn black_hole() -> std::io::Result<FaultProxy> {
        let p = FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], 9)))?;
        p.set(Fault::BlackHole);
        Ok(p)
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The port clients connect to (on 127.0.0.1).
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// How many connections the proxy has accepted so far.
    pub fn accepted(&self) -> u64 {
        self.state.accepted.load(Ordering::SeqCst)
    }

    /// Bytes forwarded from the server to the clients so far (what a
    /// client downloaded through the proxy, headers included).
    pub fn bytes_to_clients(&self) -> u64 {
        self.state.to_clients.load(Ordering::SeqCst)
    }

    /// Switches the fault for every connection, open or new.
    pub fn set(&self, fault: Fault) {
        *self.state.fault.lock().unwrap_or_else(|p| p.into_inner()) = fault;
        let open = self.state.open.lock().unwrap_or_else(|p| p.into_inner());
        for (_, client, server) in open.iter() {
            match fault {
                Fault::Cut => {
                    let _ = client.shutdown(Shutdown::Both);
                    let _ = server.shutdown(Shutdown::Both);
                }
                Fault::HalfClose => {
                    let _ = client.shutdown(Shutdown::Write);
                }
                _ => {}
            }
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.state.stopped.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        let open = self.state.open.lock().unwrap_or_else(|p| p.into_inner());
        for (_, client, server) in open.iter() {
            let _ = client.shutdown(Shutdown::Both);
            let _ = server.shutdown(Shutdown::Both);
        }
    }
}

fn accept_loop(listener: TcpListener, upstream: SocketAddr, state: Arc<State>) {
    for client in listener.incoming() {
        if state.stopped.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = client else { continue };
        state.accepted.fetch_add(1, Ordering::SeqCst);
        match state.fault() {
            Fault::Cut => {
                let _ = client.shutdown(Shutdown::Both);
                continue;
            }
            Fault::BlackHole => {
                // Held and drained, never connected upstream.
                std::thread::spawn(move || drain(client));
                continue;
            }
            _ => {}
        }
        let Ok(server) = TcpStream::connect(upstream) else {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        };
        let (Ok(c2), Ok(s2), Ok(c3), Ok(s3)) = (
            client.try_clone(),
            server.try_clone(),
            client.try_clone(),
            server.try_clone(),
        ) else {
            continue;
        };
        let id = state.accepted.load(Ordering::SeqCst);
        state
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((id, c3, s3));
        // The second direction to end forgets the connection.
        let ended = Arc::new(AtomicU64::new(0));
        let (up, down) = (state.clone(), state.clone());
        let (e1, e2) = (ended.clone(), ended);
        std::thread::spawn(move || {
            pump(client, server, &up, false);
            forget_when_both_ended(&up, id, &e1);
        });
        std::thread::spawn(move || {
            pump(s2, c2, &down, true);
            forget_when_both_ended(&down, id, &e2);
        });
    }
}

/// Counts one ended direction of connection `id`; the second one removes
/// its sockets from the open list.
fn forget_when_both_ended(state: &State, id: u64, ended: &AtomicU64) {
    if ended.fetch_add(1, Ordering::SeqCst) == 1 {
        state
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(i, _, _)| *i != id);
    }
}

/// Reads and discards until the peer closes.
fn drain(mut s: TcpStream) {
    let mut buf = [0u8; 4096];
    while matches!(s.read(&mut buf), Ok(n) if n > 0) {}
}

/// Copies `from` to `to` chunk by chunk under the current fault.
/// `to_client`: this direction carries the server's answers.
fn pump(mut from: TcpStream, mut to: TcpStream, state: &State, to_client: bool) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        match state.fault() {
            Fault::None => {}
            Fault::BlackHole => continue,
            Fault::Delay(d) => std::thread::sleep(d),
            Fault::Cut => break,
            Fault::HalfClose if to_client => continue,
            Fault::HalfClose => {}
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
        if to_client {
            state.to_clients.fetch_add(n as u64, Ordering::SeqCst);
        }
    }
    if !matches!(state.fault(), Fault::BlackHole) {
        let _ = to.shutdown(Shutdown::Write);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server: what it reads, it writes back.
    fn echo() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                std::thread::spawn(move || {
                    let mut s = s;
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = s.read(&mut buf) {
                        if n == 0 || s.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                });
            }
        });
        addr
    }

    fn round_trip(c: &mut TcpStream) -> std::io::Result<Vec<u8>> {
        c.write_all(b"ping")?;
        let mut got = [0u8; 4];
        c.read_exact(&mut got)?;
        Ok(got.to_vec())
    }

    #[test]
    fn forwards_black_holes_and_cuts() {
        let p = FaultProxy::start(echo()).expect("proxy");
        let mut c = TcpStream::connect(p.addr()).expect("connect");
        c.set_read_timeout(Some(Duration::from_millis(300)))
            .expect("timeout");
        assert_eq!(round_trip(&mut c).expect("forwarded"), b"ping");
        p.set(Fault::BlackHole);
        let e = round_trip(&mut c).expect_err("black-holed");
        assert!(
            matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "{e}"
        );
        // A new connection is accepted and never answered either.
        let mut d = TcpStream::connect(p.addr()).expect("connect");
        d.set_read_timeout(Some(Duration::from_millis(300)))
            .expect("timeout");
        assert!(round_trip(&mut d).is_err());
        p.set(Fault::None);
        let mut e2 = TcpStream::connect(p.addr()).expect("connect");
        e2.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        assert_eq!(round_trip(&mut e2).expect("forwarded again"), b"ping");
        p.set(Fault::Cut);
        let mut buf = [0u8; 4];
        assert!(matches!(e2.read(&mut buf), Ok(0) | Err(_)), "cut");
        assert!(p.accepted() >= 3);
    }

    #[test]
    fn half_close_ends_the_client_side_only() {
        let p = FaultProxy::start(echo()).expect("proxy");
        let mut c = TcpStream::connect(p.addr()).expect("connect");
        c.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        assert_eq!(round_trip(&mut c).expect("forwarded"), b"ping");
        p.set(Fault::HalfClose);
        let mut buf = [0u8; 4];
        assert_eq!(c.read(&mut buf).expect("end of stream"), 0);
        assert!(c.write_all(b"more").is_ok(), "writes still go through");
    }

    #[test]
    fn delay_holds_each_chunk() {
        let p = FaultProxy::start(echo()).expect("proxy");
        p.set(Fault::Delay(Duration::from_millis(150)));
        let mut c = TcpStream::connect(p.addr()).expect("connect");
        c.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let t = std::time::Instant::now();
        assert_eq!(round_trip(&mut c).expect("delayed"), b"ping");
        // Two chunks (there and back), each held 150 ms: a lower bound.
        assert!(
            t.elapsed() >= Duration::from_millis(300),
            "{:?}",
            t.elapsed()
        );
    }
}
