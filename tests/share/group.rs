//! The parent side: a group of member processes (this test binary run
//! again, see `member.rs`) and the directory they meet in. Dropping a group
//! kills and reaps whatever still runs, and if the test is failing prints
//! each member's output.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::member::{mono_ns, publish, Info, Lines, Mode, Role, CHILD_ENV};

/// A uid and gid to run a member as.
#[derive(Debug, Clone, Copy)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
}

pub struct Group {
    pub dir: PathBuf,
    pub port: u16,
    exe: PathBuf,
    children: BTreeMap<usize, Child>,
    /// Members reaped so far, and how they ended.
    ended: BTreeMap<usize, ExitStatus>,
    /// Users other than this process's that members ran as.
    users: Vec<u32>,
}

impl Group {
    /// A group on `port`, meeting in a fresh directory. `for_other_users`:
    /// the directory is world-writable and holds a copy of this binary that
    /// any user can run (the build's own may sit where they cannot).
    pub fn new(test: &str, port: u16, for_other_users: bool) -> Group {
        let dir = std::env::temp_dir().join(format!("softroce-share-{test}-{}-{}", std::process::id(), mono_ns()));
        fs::create_dir(&dir).unwrap();
        let mut exe = std::env::current_exe().unwrap();
        if for_other_users {
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
            let copy = dir.join("member");
            fs::copy(&exe, &copy).unwrap();
            fs::set_permissions(&copy, fs::Permissions::from_mode(0o755)).unwrap();
            exe = copy;
        }
        Group { dir, port, exe, children: BTreeMap::new(), ended: BTreeMap::new(), users: Vec::new() }
    }

    /// Member `index` of `count`, with the defaults of `mode`.
    pub fn role(&self, index: usize, count: usize, mode: Mode) -> Role {
        Role {
            dir: self.dir.clone(),
            index,
            count,
            port: self.port,
            parent: std::process::id(),
            mode,
            rc_messages: 0,
            ud_datagrams: 0,
            ack_timeout: 14,
            rc_pace_us: 0,
            ud_pace_us: 0,
            peers: Vec::new(),
        }
    }

    /// Starts a member (as `user`, if given), its output into `log-<index>`.
    pub fn spawn(&mut self, role: &Role, user: Option<User>) {
        let log = File::create(self.dir.join(format!("log-{}", role.index))).unwrap();
        let mut command = Command::new(&self.exe);
        command
            .args(["member", "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, role.encode())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        if let Some(user) = user {
            // std drops the supplementary groups too when root sets a uid.
            command.uid(user.uid).gid(user.gid).env_remove("XDG_RUNTIME_DIR").env("HOME", "/");
            self.users.push(user.uid);
        }
        let child = command.spawn().unwrap_or_else(|e| panic!("spawning member {}: {e}", role.index));
        self.children.insert(role.index, child);
    }

    fn missing<'a>(&self, names: &'a [String]) -> Vec<&'a String> {
        names.iter().filter(|n| !self.dir.join(n).exists()).collect()
    }

    /// Waits until every file in `names` exists; fails if a member exits
    /// meanwhile or `timeout` passes.
    pub fn wait_for(&mut self, names: &[String], timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let missing = self.missing(names);
            if missing.is_empty() {
                return;
            }
            for (index, child) in &mut self.children {
                if let Some(status) = child.try_wait().unwrap() {
                    panic!("member {index} ended ({status}) while the parent waited for {missing:?}");
                }
            }
            assert!(Instant::now() < deadline, "waited {timeout:?} for {missing:?}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// `<prefix>-<i>` for each `i`.
    pub fn files(prefix: &str, members: impl IntoIterator<Item = usize>) -> Vec<String> {
        members.into_iter().map(|i| format!("{prefix}-{i}")).collect()
    }

    /// SIGKILLs member `index` and reaps it; returns when the kill was sent
    /// ([`mono_ns`]).
    pub fn kill(&mut self, index: usize) -> u64 {
        let mut child = self.children.remove(&index).expect("a running member");
        let at = mono_ns();
        child.kill().unwrap();
        let status = child.wait().unwrap();
        self.ended.insert(index, status);
        at
    }

    /// Waits for member `index` to end by itself; fails if it does not
    /// within `timeout` or ends with an error.
    pub fn wait_exit(&mut self, index: usize, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let child = self.children.get_mut(&index).expect("a running member");
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "member {index} still runs after {timeout:?}");
            std::thread::sleep(Duration::from_millis(5));
        };
        self.children.remove(&index);
        self.ended.insert(index, status);
        assert!(status.success(), "member {index} failed: {status}");
    }

    /// Tells every member to exit and checks that each does, cleanly.
    pub fn finish(&mut self, timeout: Duration) {
        publish(&self.dir, "exit", "");
        let indices: Vec<usize> = self.children.keys().copied().collect();
        for index in indices {
            self.wait_exit(index, timeout);
        }
    }

    /// What member `index` published in `ep-<index>`.
    pub fn info(&self, index: usize) -> Info {
        Info::read(&self.dir, index).unwrap_or_else(|| panic!("member {index} published no endpoints"))
    }

    /// Member `index`'s `result-<index>`.
    pub fn result(&self, index: usize) -> Lines {
        Lines::read(&self.dir.join(format!("result-{index}"))).unwrap_or_else(|| panic!("member {index}: no result"))
    }

    fn log_tail(&self, index: usize) -> String {
        let text = fs::read_to_string(self.dir.join(format!("log-{index}"))).unwrap_or_default();
        let start = text.len().saturating_sub(4000);
        let start = (start..text.len()).find(|&i| text.is_char_boundary(i)).unwrap_or(text.len());
        text[start..].to_string()
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        for child in self.children.values_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            let mut indices: Vec<usize> = self.ended.keys().copied().collect();
            indices.extend(self.children.keys());
            indices.sort_unstable();
            for index in indices {
                let how = self.ended.get(&index).map_or("killed by the failing test".to_string(), |s| s.to_string());
                eprintln!("---- member {index} ({how}), the end of its output:\n{}", self.log_tail(index));
            }
            eprintln!("---- the group's files are kept in {}", self.dir.display());
        } else {
            let _ = fs::remove_dir_all(&self.dir);
            // The shared port's bookkeeping outlives its members (a killed
            // member leaves its inbox too); with every member gone, the
            // port's directory of each user goes. Members of other users
            // had no XDG_RUNTIME_DIR: theirs is in the temporary directory.
            let port = format!("port-{}", self.port);
            let mut dirs: Vec<PathBuf> = softroce::rundir::user_directory(&port).into_iter().collect();
            dirs.extend(self.users.iter().map(|uid| std::env::temp_dir().join(format!("softroce-{uid}")).join(&port)));
            for dir in dirs {
                let _ = fs::remove_dir_all(dir);
            }
        }
    }
}
