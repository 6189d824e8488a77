//! Command line and environment. Every flag can also come from a `TESSERA_*` variable.

use clap::{Args, Parser, Subcommand};
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(
    name = "tessera",
    version = tessera_model::version::long(),
    about = "GPU-sharing control plane and web console"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the console, the API and the agent endpoints.
    Serve(ServeArgs),
    /// Manage operators' accounts directly in the database (for a locked-out operator).
    User {
        #[command(flatten)]
        db: DbArgs,
        #[command(subcommand)]
        command: UserCommand,
    },
    /// Copy the embedded SQLite database into a new FILE while the server runs (a
    /// consistent copy, checked; for PostgreSQL it names `pg_dump`). See
    /// docs/operations.md, "Backup and restore".
    Backup {
        #[command(flatten)]
        db: DbArgs,
        /// The new file (never written over).
        file: PathBuf,
    },
    /// Copy a fleet's SQLite database into a new PostgreSQL database, to run several
    /// servers on it: every table in one transaction (all or nothing), each checked by
    /// count. Stop the server first. See docs/operations.md, "PostgreSQL and several
    /// servers".
    MigrateStore {
        /// The SQLite database: sqlite:///var/lib/tessera/tessera.db.
        #[arg(long, env = "TESSERA_MIGRATE_FROM")]
        from: String,
        /// The new PostgreSQL database: postgres://USER@HOST/DATABASE (its password from
        /// the environment rather than this line: PGPASSWORD or TESSERA_MIGRATE_TO).
        #[arg(long, env = "TESSERA_MIGRATE_TO")]
        to: String,
    },
    /// A small HTTP service for trying serving with processes: `/`, `/health` and
    /// `/metrics` on `$PORT`; finishes requests in flight on SIGTERM.
    ExampleServer {
        /// Listen here instead of `$PORT`.
        #[arg(long)]
        port: Option<u16>,
    },
    /// Print the API's OpenAPI document (what `/api/v1/openapi.json` serves), for client
    /// generators and schema-driven testers.
    Openapi,
    /// Make a private certificate authority and the server's certificate for HTTPS (and
    /// the CA file agents trust).
    Tls {
        #[command(subcommand)]
        command: crate::cli::tls::TlsCommand,
    },
    #[command(flatten)]
    Client(crate::cli::ClientCommand),
}

/// Where the database is.
#[derive(Clone, Args)]
pub struct DbArgs {
    /// Directory for the embedded database (created if missing).
    #[arg(long, env = "TESSERA_DATA_DIR", default_value = "data", global = true)]
    pub data_dir: PathBuf,
    /// Database URL; defaults to `sqlite://<data-dir>/tessera.db`.
    #[arg(long, env = "TESSERA_DATABASE", global = true)]
    pub database: Option<String>,
}

impl DbArgs {
    pub fn database_url(&self) -> String {
        self.database
            .clone()
            .unwrap_or_else(|| format!("sqlite://{}", self.data_dir.join("tessera.db").display()))
    }
}

impl fmt::Debug for DbArgs {
    /// Never prints a database password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DbArgs")
            .field("data_dir", &self.data_dir)
            .field("database", &self.database.as_deref().map(redact_url))
            .finish()
    }
}

/// `tessera user ...`. Passwords come from `--password-file`, `TESSERA_PASSWORD`, or a
/// prompt; never from the command line, where other users of the machine could read them.
#[derive(Debug, Subcommand)]
pub enum UserCommand {
    /// Add a user.
    Add {
        username: String,
        /// viewer, operator or admin.
        #[arg(long, default_value = "viewer")]
        role: String,
        #[arg(long)]
        password_file: Option<PathBuf>,
    },
    /// Set a user's password (ends the user's sessions).
    Passwd {
        username: String,
        #[arg(long)]
        password_file: Option<PathBuf>,
    },
    /// List users.
    List,
    /// Disable a user: no sign-in; sessions and tokens it made stop working at once.
    Disable { username: String },
    /// Enable a disabled user again.
    Enable { username: String },
}

#[derive(Clone, Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "TESSERA_BIND", default_value = "127.0.0.1:3000")]
    pub bind: SocketAddr,
    #[command(flatten)]
    pub db: DbArgs,
    /// The admin's password, from this file (or TESSERA_ADMIN_PASSWORD); when neither is
    /// given, one is generated on first start and printed once.
    #[arg(long, env = "TESSERA_ADMIN_PASSWORD_FILE")]
    pub admin_password_file: Option<PathBuf>,
    /// Host names requests may name (comma-separated; `*` for any). Default: the bind
    /// address, localhost, 127.0.0.1 and ::1.
    #[arg(long, env = "TESSERA_ALLOWED_HOSTS", value_delimiter = ',')]
    pub allowed_hosts: Vec<String>,
    /// Serve HTTPS with this certificate chain (PEM); needs --tls-key.
    #[arg(long, env = "TESSERA_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, env = "TESSERA_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Add a simulated demo fleet (labelled as simulated everywhere).
    #[arg(long, env = "TESSERA_DEMO")]
    pub demo: bool,
    /// The token agents register with; generated and printed on first start when unset.
    /// From the environment only: on the command line (refused) every local user could
    /// read it in /proc/PID/cmdline.
    #[arg(long, env = "TESSERA_JOIN_TOKEN", hide_env_values = true)]
    pub join_token: Option<String>,
    /// The join token, from this file (readable by the server's user only).
    #[arg(long, env = "TESSERA_JOIN_TOKEN_FILE", conflicts_with = "join_token")]
    pub join_token_file: Option<PathBuf>,
    /// How often agents sync, in seconds; a host silent for 3 intervals is lost.
    #[arg(long, env = "TESSERA_SYNC_INTERVAL", default_value_t = 5)]
    pub sync_interval_secs: u64,
    /// How long (seconds) a task's measured GPU memory may stay above its budget before its
    /// pool's `gpu_budget` acts: stops it (`enforce`) or says so (`warn`).
    #[arg(long, env = "TESSERA_GPU_BUDGET_GRACE", default_value_t = 30)]
    pub gpu_budget_grace_secs: u64,
    /// Stopped tasks, events and finished deployments are deleted after this many days.
    #[arg(long, env = "TESSERA_RETENTION_DAYS", default_value_t = 7)]
    pub retention_days: u64,
    /// Audit log entries are deleted after this many days.
    #[arg(long, env = "TESSERA_AUDIT_RETENTION_DAYS", default_value_t = 90)]
    pub audit_retention_days: u64,
    /// Connections one client address may hold open; raise it when every client comes
    /// through one proxy.
    #[arg(long, env = "TESSERA_CONNECTIONS_PER_ADDRESS", default_value_t = 256)]
    pub connections_per_address: usize,
    /// Requests one client address may have in flight (agents' syncs aside).
    #[arg(long, env = "TESSERA_REQUESTS_PER_ADDRESS", default_value_t = 64)]
    pub requests_per_address: usize,
    /// Task log reads, follows and exec sessions one user or token may have open at once
    /// (`tessera logs SERVICE -f` opens one per running task).
    #[arg(long, env = "TESSERA_TASK_STREAMS_PER_USER", default_value_t = 64)]
    pub task_streams_per_user: usize,
    /// The load balancers in front of the server (`10.0.0.0/8,192.0.2.7`): a request from
    /// one of them names its client in `Forwarded` or `X-Forwarded-For`, which the
    /// per-address limits, the sign-in limit and the audit log then count. Nobody's by
    /// default: the peer's address is the client's.
    #[arg(long, env = "TESSERA_TRUSTED_PROXIES", value_delimiter = ',')]
    pub trusted_proxies: Vec<crate::forwarded::Cidr>,
    /// Seconds a new connection may take to send its first request, and a request its
    /// headers (a body may not pause longer); a connection idle that long is closed
    /// quietly.
    #[arg(long, env = "TESSERA_HEADER_TIMEOUT_SECS", default_value_t = 10)]
    pub header_timeout_secs: u64,
    /// Seconds a request may take, from its headers to its answer (`503` past it).
    #[arg(long, env = "TESSERA_REQUEST_TIMEOUT_SECS", default_value_t = 30)]
    pub request_timeout_secs: u64,
}

/// Why `args` (the process's own, as `/proc/PID/cmdline` shows them to every local user)
/// must not be taken: a join token or a database password among them.
pub fn secret_on_command_line(args: &[String]) -> Option<String> {
    let mut args = args.iter();
    while let Some(a) = args.next() {
        if a == "--join-token" || a.starts_with("--join-token=") {
            return Some("--join-token puts the token on the command line, which every process on this host can read (/proc/PID/cmdline): set TESSERA_JOIN_TOKEN, or pass --join-token-file FILE (readable by this user only)".into());
        }
        let url = match a.strip_prefix("--database=") {
            Some(v) => Some(v.to_owned()),
            None if a == "--database" => args.next().cloned(),
            None => None,
        };
        if url.as_deref().is_some_and(|u| redact_url(u) != u) {
            return Some("--database carries a password on the command line, which every process on this host can read (/proc/PID/cmdline): set TESSERA_DATABASE instead, or leave the password out of the URL and set PGPASSWORD".into());
        }
    }
    None
}

/// A database URL with any password replaced, for logs.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let userinfo = &url[scheme_end + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme_end + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

impl fmt::Debug for ServeArgs {
    /// Never prints a database password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServeArgs")
            .field("bind", &self.bind)
            .field("db", &self.db)
            .field("admin_password_file", &self.admin_password_file)
            .field("allowed_hosts", &self.allowed_hosts)
            .field("tls_cert", &self.tls_cert)
            .field("tls_key", &self.tls_key)
            .field("demo", &self.demo)
            .field("join_token", &self.join_token.as_ref().map(|_| "***"))
            .field("join_token_file", &self.join_token_file)
            .field("sync_interval_secs", &self.sync_interval_secs)
            .field("gpu_budget_grace_secs", &self.gpu_budget_grace_secs)
            .field("retention_days", &self.retention_days)
            .field("audit_retention_days", &self.audit_retention_days)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_on_the_command_line_are_refused() {
        let argv = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        for bad in [
            argv(&["tessera", "serve", "--join-token", "abc"]),
            argv(&["tessera", "serve", "--join-token=abc"]),
            argv(&["tessera", "serve", "--database", "postgres://u:pw@db/t"]),
            argv(&["tessera", "serve", "--database=postgres://u:pw@db/t"]),
        ] {
            let why = secret_on_command_line(&bad).expect("refused");
            assert!(why.contains("/proc/PID/cmdline"), "{why}");
        }
        for good in [
            argv(&["tessera", "serve", "--join-token-file", "/etc/tessera/join"]),
            argv(&["tessera", "serve", "--database", "postgres://u@db/t"]),
            argv(&["tessera", "serve", "--data-dir", "data"]),
        ] {
            assert_eq!(secret_on_command_line(&good), None, "{good:?}");
        }
    }

    #[test]
    fn passwords_never_reach_debug_output() {
        let args = ServeArgs {
            bind: "127.0.0.1:3000".parse().expect("valid"),
            db: DbArgs {
                data_dir: "data".into(),
                database: Some("postgres://tessera:s3cret@db:5432/tessera".into()),
            },
            admin_password_file: None,
            allowed_hosts: vec![],
            tls_cert: None,
            tls_key: None,
            demo: false,
            join_token: Some("join-s3cret-token".into()),
            join_token_file: None,
            sync_interval_secs: 5,
            gpu_budget_grace_secs: 30,
            retention_days: 7,
            audit_retention_days: 90,
            connections_per_address: 256,
            requests_per_address: 64,
            task_streams_per_user: 64,
            trusted_proxies: Vec::new(),
            header_timeout_secs: 10,
            request_timeout_secs: 30,
        };
        let printed = format!("{args:?}");
        assert!(!printed.contains("s3cret"), "{printed}");
        assert!(printed.contains("join_token: Some(\"***\")"), "{printed}");
        assert!(printed.contains("tessera:***@db"), "{printed}");
    }

    /// Every `tessera …` command the documents and the code's messages and comments name
    /// (in backticks) is one this binary has: its subcommands exist, and so do the flags
    /// it names. Placeholders (`NAME`, `…`) and alternatives (`drain|activate`) are read
    /// as written in the usage lines.
    #[test]
    fn the_commands_documents_name_exist() {
        use clap::CommandFactory;
        let root = workspace_root();
        let mut files = vec![root.join("README.md")];
        files.extend(files_below(
            &[
                "docs",
                "cli/src",
                "control/src",
                "server/src",
                "agent/src",
                "app/src",
            ],
            &["md", "rs"],
        ));
        let cli = Cli::command();
        let mut checked = 0;
        let mut wrong = Vec::new();
        for file in &files {
            let text = std::fs::read_to_string(file).expect("readable");
            for (at, _) in text.match_indices("`tessera ") {
                let named = &text[at + 1..];
                let Some(end) = named[1..].find('`') else {
                    continue;
                };
                let named = named[..end + 1].replace("\\|", "|");
                if let Err(e) = names_a_command(&cli, &named) {
                    let file = file.strip_prefix(&root).unwrap_or(file);
                    wrong.push(format!("{}: `{named}`: {e}", file.display()));
                }
                checked += 1;
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
        assert!(checked >= 80, "{checked} commands named");
    }

    /// A command a message names without backticks (`run tessera join-token create --pool
    /// …`) parses too: in the source of every crate, each `tessera WORD` whose word is not
    /// one of the few that make it prose (`this tessera wrote`) names a subcommand and only
    /// flags it has (a value written as `{owner}` ends what is read). A message that once
    /// named join-token's words the wrong way round fails here.
    #[test]
    fn the_commands_messages_name_exist() {
        use clap::CommandFactory;
        const PROSE: [&str; 2] = ["wrote", "cannot"];
        let root = workspace_root();
        let cli = Cli::command();
        let (mut checked, mut wrong) = (0, Vec::new());
        let sources = [
            "cli/src",
            "control/src",
            "server/src",
            "agent/src",
            "app/src",
            "model/src",
        ];
        for path in files_below(&sources, &["rs"]) {
            let text = std::fs::read_to_string(&path).expect("readable");
            for (at, _) in text.match_indices("tessera ") {
                let before = text[..at].chars().next_back().unwrap_or(' ');
                if before == '`' || before.is_alphanumeric() || "_-/.".contains(before) {
                    continue;
                }
                let named = &text[at..];
                let end = named
                    .find(['"', '`', ')', '\n', ',', ';', ':', '\\', '{'])
                    .unwrap_or(named.len());
                let named = named[..end].trim_end();
                let Some(word) = named.split_whitespace().nth(1) else {
                    continue;
                };
                if PROSE.contains(&word) || !word.starts_with(|c: char| c.is_ascii_lowercase()) {
                    continue;
                }
                if let Err(e) = names_a_command(&cli, named) {
                    let file = path.strip_prefix(&root).unwrap_or(&path);
                    wrong.push(format!("{}: {named:?}: {e}", file.display()));
                }
                checked += 1;
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
        assert!(checked >= 5, "{checked} commands named");
    }

    /// The check above catches a command that does not exist.
    #[test]
    fn a_command_that_does_not_exist_is_named_as_such() {
        use clap::CommandFactory;
        let cli = Cli::command();
        // Spelt in pieces, so that the scan above does not read them as messages.
        let wrong_way_round = ["tessera", "create", "join-token"].join(" ");
        assert!(names_a_command(&cli, &wrong_way_round).is_err());
        assert!(names_a_command(&cli, "tessera join-token create --pool gpu").is_ok());
        let no_such_flag = ["tessera", "join-token", "create", "--pools", "gpu"].join(" ");
        assert!(names_a_command(&cli, &no_such_flag).is_err());
    }

    /// The workspace's root (the server crate's parent).
    fn workspace_root() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    /// Every file with one of `extensions` in the workspace's folders `dirs`, at any depth.
    fn files_below(dirs: &[&str], extensions: &[&str]) -> Vec<std::path::PathBuf> {
        let mut dirs: Vec<_> = dirs.iter().map(|d| workspace_root().join(d)).collect();
        let mut files = Vec::new();
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).expect("a source directory") {
                let path = entry.expect("entry").path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path
                    .extension()
                    .is_some_and(|e| extensions.iter().any(|x| e == *x))
                {
                    files.push(path);
                }
            }
        }
        files
    }

    /// Whether `named` (`tessera get hosts|tasks [-o wide]`) walks `cli`'s subcommands and
    /// names only flags they have.
    fn names_a_command(cli: &clap::Command, named: &str) -> Result<(), String> {
        let words: Vec<&str> = named.split_whitespace().skip(1).collect();
        let mut at = vec![cli.clone()];
        let mut rest = &words[..];
        // Subcommands, as deep as the words go (each alternative of `a|b` must be one).
        while let Some((word, more)) = rest.split_first() {
            let here = at.last().expect("a command");
            if here.get_subcommands().next().is_none()
                || !word.starts_with(|c: char| c.is_ascii_lowercase())
            {
                break;
            }
            let alternatives: Vec<&str> = word.split('|').collect();
            let found: Vec<&clap::Command> = alternatives
                .iter()
                .filter_map(|a| here.find_subcommand(a))
                .collect();
            if found.is_empty() {
                return Err(format!("{} has no subcommand {word}", here.get_name()));
            }
            if found.len() != alternatives.len() {
                return Err(format!("{word}: not every alternative is a subcommand"));
            }
            // Flags are checked against the first alternative's.
            at.push(found[0].clone());
            rest = more;
        }
        for word in rest {
            let word = word.trim_matches(|c| c == '[' || c == ']' || c == '(' || c == ')');
            let flag = word.split('=').next().unwrap_or(word);
            let known = |c: &clap::Command| {
                c.get_arguments().any(|a| {
                    if let Some(long) = flag.strip_prefix("--") {
                        a.get_long() == Some(long)
                    } else if let Some(short) = flag.strip_prefix('-') {
                        short
                            .chars()
                            .all(|s| c.get_arguments().any(|b| b.get_short() == Some(s)))
                    } else {
                        true
                    }
                })
            };
            if flag.len() > 1 && flag.starts_with('-') && flag != "--" && !at.iter().any(known) {
                return Err(format!(
                    "{} has no flag {flag}",
                    at.last().expect("a command").get_name()
                ));
            }
        }
        Ok(())
    }

    #[test]
    fn default_database_lives_in_the_data_dir() {
        let cli = Cli::try_parse_from(["tessera", "serve", "--data-dir", "/var/lib/tessera"])
            .expect("parses");
        let Command::Serve(args) = cli.command else {
            panic!("serve parses as serve");
        };
        assert_eq!(
            args.db.database_url(),
            "sqlite:///var/lib/tessera/tessera.db"
        );
        let cli = Cli::try_parse_from(["tessera", "user", "list", "--data-dir", "/srv/t"])
            .expect("parses");
        let Command::User { db, command } = cli.command else {
            panic!("user parses as user");
        };
        assert!(matches!(command, UserCommand::List));
        assert_eq!(db.database_url(), "sqlite:///srv/t/tessera.db");
    }
}
