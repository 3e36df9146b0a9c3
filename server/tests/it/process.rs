//! Starting and stopping `resd` processes for tests.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use proto::cluster::v1::cluster_service_client::ClusterServiceClient;
use proto::resource::v1::resource_service_client::ResourceServiceClient;
use tonic::transport::Channel;

/// How long a starting resd may take to print its address.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a stopping resd may take to exit.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

/// A `resd agent` process on a free loopback port. Killed by its PID when dropped.
pub struct Resd {
    child: Child,
    pub api_addr: SocketAddr,
}

impl Resd {
    pub fn start() -> Resd {
        Self::start_with(&[])
    }

    pub fn start_with(extra_args: &[&str]) -> Resd {
        let mut child = Command::new(env!("CARGO_BIN_EXE_resd"))
            .args(["agent", "--api-addr", "127.0.0.1:0"])
            .args(extra_args)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn resd");
        let stdout = child.stdout.take().expect("piped stdout");
        let (sender, receiver) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if let Some(addr) = line.strip_prefix("resd: serving gRPC on ") {
                    let _ = sender.send(addr.trim().to_owned());
                }
            }
        });
        let addr = match receiver.recv_timeout(START_TIMEOUT) {
            Ok(addr) => addr,
            Err(_) => {
                let _ = child.kill();
                panic!("resd did not report its address within {START_TIMEOUT:?}");
            }
        };
        Resd {
            child,
            api_addr: addr.parse().expect("resd prints a socket address"),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.api_addr))
            .expect("valid uri")
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .expect("connect to resd")
    }

    pub async fn resources(&self) -> ResourceServiceClient<Channel> {
        ResourceServiceClient::new(self.channel().await).max_decoding_message_size(16 * 1024 * 1024)
    }

    pub async fn cluster(&self) -> ClusterServiceClient<Channel> {
        ClusterServiceClient::new(self.channel().await)
    }

    /// Sends SIGTERM to this process (by PID) and waits for it to exit.
    pub fn terminate(&mut self) -> ExitStatus {
        let status = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM {} failed", self.pid());
        self.wait_exit(STOP_TIMEOUT)
            .expect("resd exits after SIGTERM")
    }

    fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Resd {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
