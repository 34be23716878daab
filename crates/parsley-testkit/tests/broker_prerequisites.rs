//! A missing or old Java, or a missing Maven, is a clear error saying what to install.
//!
//! One test in its own binary: it changes `PATH`, which is process-wide.

use std::os::unix::fs::PermissionsExt;

use parsley_testkit::broker::{BrokerError, check_java, check_maven};

#[test]
fn missing_or_old_java_and_missing_maven_name_what_to_install() {
    let original = std::env::var_os("PATH").unwrap_or_default();
    let dir = std::env::temp_dir().join(format!("parsley-prereq-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    // SAFETY: this binary runs a single test, so no other thread reads the environment.
    unsafe { std::env::set_var("PATH", &dir) };
    let java = check_java().unwrap_err();
    assert!(matches!(
        java,
        BrokerError::MissingProgram {
            program: "java",
            ..
        }
    ));
    assert!(
        java.to_string().contains("openjdk-17-jre-headless"),
        "{java}"
    );
    let mvn = check_maven().unwrap_err();
    assert!(mvn.to_string().contains("apt-get install maven"), "{mvn}");

    // A Java 11 on PATH is refused with the version it reported.
    let fake = dir.join("java");
    std::fs::write(
        &fake,
        "#!/bin/sh\necho 'openjdk version \"11.0.21\" 2023-10-17' >&2\n",
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let old = check_java().unwrap_err();
    assert!(
        matches!(old, BrokerError::JavaTooOld { ref found } if found.contains("11.0.21")),
        "{old}"
    );

    // SAFETY: as above.
    unsafe { std::env::set_var("PATH", &original) };
    assert!(check_java().unwrap() >= 17, "the machine's own Java");
    std::fs::remove_dir_all(&dir).unwrap();
}
