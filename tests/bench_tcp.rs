//! `barlink bench --tcp` on loopback: a server and a client process, the
//! key from a file, rows for barlink, iperf3 (where installed) and the
//! plain TCP ping-pong; its usage errors (exit 2).

use std::process::{Command, Output, Stdio};
use std::time::Duration;

fn barlink(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_barlink"));
    command
        .args(args)
        .env_remove("BARLINK_SIZES")
        .env_remove("BARLINK_PSK_FILE")
        .env_remove("BARLINK_PSK");
    command
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn psk_file(tag: &str) -> String {
    let path = std::env::temp_dir().join(format!("barlink-bench-tcp-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let made = barlink(&["keygen", "--psk", "--out", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    path.display().to_string()
}

/// Runs server and client on loopback; both outputs.
fn run(extra: &[&str]) -> (Output, Output) {
    let psk = psk_file(if extra.contains(&"--encrypt") {
        "enc"
    } else {
        "plain"
    });
    // Three ports: barlink's, iperf3's (+1) and the ping-pong's (+2).
    let port = loop {
        let port = free_port();
        if port < 65_000 {
            break port;
        }
    };
    let listen = format!("127.0.0.1:{port}");
    let mut server_args = vec![
        "bench",
        "--tcp",
        "--server",
        "--listen",
        &listen,
        "--psk-file",
        &psk,
        "--json",
    ];
    server_args.extend_from_slice(extra);
    let server = barlink(&server_args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let mut client_args = vec![
        "bench",
        "--tcp",
        &listen,
        "--psk-file",
        &psk,
        "--json",
        "--sizes",
        "64,64K",
        "--windows",
        "3",
    ];
    client_args.extend_from_slice(extra);
    let client = barlink(&client_args).output().unwrap();
    let server = server.wait_with_output().unwrap();
    let _ = std::fs::remove_file(&psk);
    (client, server)
}

fn rows(output: &Output) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line:?}: {e}")))
        .collect()
}

fn has_iperf3() -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join("iperf3").is_file()))
}

#[test]
fn bench_tcp_on_loopback_measures_barlink_and_its_baselines() {
    for extra in [&[][..], &["--encrypt"][..]] {
        let (client, server) = run(extra);
        assert!(
            client.status.success(),
            "client: {client:?}\nserver: {server:?}"
        );
        assert!(server.status.success(), "server: {server:?}");
        let rows = rows(&client);
        for size in [64, 65536] {
            let barlink = rows
                .iter()
                .find(|r| r["path"] == "barlink-tcp" && r["size_bytes"] == size)
                .unwrap_or_else(|| panic!("no barlink-tcp row at {size}: {rows:?}"));
            assert!(barlink["gbps"].as_f64().unwrap() > 0.0, "{barlink}");
            assert_eq!(barlink["lost"], 0, "{barlink}");
            assert_eq!(barlink["encrypted"], !extra.is_empty(), "{barlink}");
            let decision = barlink["path_decision"].as_str().unwrap();
            assert!(decision.contains("pre-shared key"), "{decision}");
            assert!(
                barlink["lat_ratio_to_tcp_ping_pong"].as_f64().unwrap() > 0.0,
                "{barlink}"
            );
            assert!(
                rows.iter()
                    .any(|r| r["path"] == "tcp-ping-pong" && r["size_bytes"] == size)
            );
            if has_iperf3() {
                assert!(
                    barlink["ratio_to_iperf3"].as_f64().unwrap() > 0.0,
                    "{barlink}"
                );
                assert!(
                    rows.iter()
                        .any(|r| r["path"] == "iperf3" && r["size_bytes"] == size)
                );
            }
        }
        // The server printed the client's rows too.
        assert_eq!(self::rows(&server).len(), rows.len());
    }
    if !has_iperf3() {
        eprintln!(
            "SKIPPED bench_tcp_on_loopback_measures_barlink_and_its_baselines (iperf3 part): iperf3 is not installed (apt install iperf3)"
        );
    }
}

#[test]
fn tcp_usage_errors_exit_2() {
    for (args, expected) in [
        (&["bench", "--tcp"][..], "needs a role"),
        (
            &["bench", "--tcp", "--rdma", "h"][..],
            "cannot be used with",
        ),
        (&["bench", "--encrypt", "h"][..], "--tcp"),
        (
            &["bench", "--tcp", "h", "--fault-rate", "0.1"][..],
            "--fault-rate",
        ),
        (
            &["bench", "--tcp", "h:1", "--psk-file", "/nonexistent/psk"][..],
            "cannot read it",
        ),
    ] {
        let output = barlink(args).output().unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}: {output:?}");
        assert!(
            stderr(&output).contains(expected),
            "{args:?}: {}",
            stderr(&output)
        );
    }
}

#[test]
fn bench_tcp_without_a_key_says_how_to_set_one() {
    let port = free_port().to_string();
    let output = barlink(&["bench", "--tcp", &format!("127.0.0.1:{port}")])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(3), "{output:?}");
    let text = stderr(&output);
    assert!(
        text.contains("BARLINK_PSK_FILE") && text.contains("--insecure"),
        "{text}"
    );
}
