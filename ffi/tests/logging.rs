//! The C library's log: silent while `BARLINK_LOG` is unset, on stderr as
//! it says once set, a value that does not parse reported and not fatal.
//! Each case runs in a process of its own (this binary again), since a
//! process takes its logger once.

use std::process::Command;

use barlink_ffi::*;

mod support;

use support::pair;

/// The half that runs in the child: one link set up and closed.
const CHILD: &str = "a_link_set_up_in_a_process_of_its_own";
const CHILD_VAR: &str = "BARLINK_TEST_LOGGING_CHILD";

/// The child's stderr, with `BARLINK_LOG` set to `value` (or unset).
fn child_stderr(value: Option<&str>) -> String {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["--ignored", "--exact", "--nocapture", CHILD])
        .env(CHILD_VAR, "1")
        .env_remove("BARLINK_LOG");
    if let Some(value) = value {
        command.env("BARLINK_LOG", value);
    }
    let out = command.output().expect("running this test binary again");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "the child failed ({}):\n{stderr}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
    stderr
}

#[test]
fn the_library_logs_only_as_barlink_log_says() {
    let setup = "memfd rings exchanged";
    let unset = child_stderr(None);
    assert!(
        !unset.contains(setup) && !unset.contains("barlink"),
        "unset, the library says nothing:\n{unset}"
    );
    let info = child_stderr(Some("info"));
    assert!(info.contains(setup), "info shows the setup:\n{info}");
    let warn = child_stderr(Some("warn"));
    assert!(!warn.contains(setup), "warn leaves info out:\n{warn}");
    let targets = child_stderr(Some("barlink_transport=info"));
    assert!(targets.contains(setup), "a target's level:\n{targets}");
    let nonsense = child_stderr(Some("info=loud=2"));
    assert!(
        nonsense.contains("is not a log filter"),
        "a value that does not parse is reported:\n{nonsense}"
    );
}

#[test]
#[ignore = "started by the_library_logs_only_as_barlink_log_says"]
fn a_link_set_up_in_a_process_of_its_own() {
    if std::env::var_os(CHILD_VAR).is_none() {
        // Past libtest's capture, as the guest tests' skips are.
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED {CHILD}: started only by the_library_logs_only_as_barlink_log_says"
        );
        return;
    }
    let (a, b) = pair(None);
    assert_eq!(barlink_close(a, 1000), barlink_status::BARLINK_OK);
    assert_eq!(barlink_close(b, 1000), barlink_status::BARLINK_OK);
}
