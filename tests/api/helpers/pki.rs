//! Certificates for TLS tests, made with openssl in a directory of their own: CAs, and server certificates they
//! sign (`NAME.key`, `NAME.crt`, `NAME.ext` for the extensions).

use std::path::PathBuf;
use std::process::Command;

use super::{require_tool, write_file};

pub struct TestPki {
    dir: tempfile::TempDir,
}

/// A P-256 key, the default for CAs and servers.
pub const EC: &str = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1";

impl TestPki {
    /// A directory with the CA `name` in it.
    pub fn with_ca(name: &str) -> Self {
        require_tool("openssl", "apt package openssl");
        let pki = TestPki { dir: tempfile::tempdir().expect("temp dir") };
        pki.ca(name);
        pki
    }

    /// A self-signed CA `name` (`NAME.key`, `NAME.crt`).
    pub fn ca(&self, name: &str) {
        self.openssl(&format!(
            "req -x509 {EC} -nodes -days 2 -keyout {name}.key -out {name}.crt -subj /CN=blobgate-test-{name} \
             -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign"
        ));
    }

    /// A server certificate `name` for `subject_alt_name` (`DNS:localhost,IP:127.0.0.1`), with a key made by
    /// `newkey` (openssl's `-newkey` arguments, e.g. [`EC`] or `-newkey rsa:2048`), signed by the CA `ca`.
    pub fn server(&self, name: &str, newkey: &str, subject_alt_name: &str, ca: &str) {
        self.openssl(&format!("req {newkey} -nodes -keyout {name}.key -out {name}.csr -subj /CN=localhost"));
        let ext = format!(
            "subjectAltName = {subject_alt_name}\nbasicConstraints = critical,CA:FALSE\n\
             keyUsage = critical,digitalSignature\nextendedKeyUsage = serverAuth\n"
        );
        write_file(self.dir.path(), &format!("{name}.ext"), ext.as_bytes());
        self.openssl(&format!(
            "x509 -req -in {name}.csr -CA {ca}.crt -CAkey {ca}.key -CAcreateserial -days 2 -extfile {name}.ext \
             -out {name}.crt"
        ));
    }

    /// `openssl ARGS` in the directory (`args` split at whitespace); it must succeed.
    pub fn openssl(&self, args: &str) {
        let out = Command::new("openssl")
            .args(args.split_whitespace())
            .current_dir(self.dir.path())
            .output()
            .expect("run openssl");
        assert!(out.status.success(), "openssl {args}: {}", String::from_utf8_lossy(&out.stderr));
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// [`TestPki::file`] as a string, for command lines.
    pub fn path(&self, name: &str) -> String {
        self.file(name).to_str().expect("a UTF-8 temp path").to_owned()
    }

    /// The SHA-256 of certificate `name`'s DER, as `openssl x509 -fingerprint` prints it (colons, upper case).
    pub fn fingerprint(&self, name: &str) -> String {
        let out = Command::new("openssl")
            .args(["x509", "-noout", "-fingerprint", "-sha256", "-in"])
            .arg(self.file(&format!("{name}.crt")))
            .output()
            .expect("run openssl");
        String::from_utf8(out.stdout).unwrap().trim().rsplit('=').next().unwrap().to_owned()
    }
}
