//! `weir k8s manifests JOB.sql --workers N`: what a user applies to run a
//! job spread over `weir worker` pods. Kubernetes places and restarts the
//! workers; Weir turns a restart into a job recovery (every worker
//! restores the latest checkpoint, which must be on an object store all
//! pods reach).
//!
//! - a ConfigMap with the SQL file;
//! - a headless Service giving each pod a stable name
//!   (`<name>-<i>.<name>.<namespace>.svc`), published before the pods are
//!   ready, since workers must find each other to become ready;
//! - a StatefulSet (an unbounded job) or an Indexed Job (a bounded one,
//!   which must not be started again once it finished): the pod's index
//!   is the worker's `--index`, from the `apps.kubernetes.io/pod-index`
//!   label (Kubernetes 1.28+) or `JOB_COMPLETION_INDEX`; probes on the
//!   metrics port; S3 credentials from a Secret.

use std::path::PathBuf;

/// `weir k8s manifests`.
#[derive(clap::Args, Debug)]
pub struct ManifestArgs {
    /// The job's SQL file (what every worker runs).
    pub file: PathBuf,
    /// Worker pods.
    #[arg(long)]
    pub workers: usize,
    /// Name of the StatefulSet / Job, Service and ConfigMap (default: the
    /// file's name). Lowercase letters, digits and '-'.
    #[arg(long)]
    pub name: Option<String>,
    #[arg(long, default_value = "default")]
    pub namespace: String,
    /// The container image with `weir` on its PATH.
    #[arg(long, default_value = "ghcr.io/weir-sql/weir:latest")]
    pub image: String,
    /// `statefulset` for an unbounded job, `job` for a bounded one (a
    /// StatefulSet starts a finished worker again).
    #[arg(long, default_value = "statefulset")]
    pub kind: String,
    /// The workers' exchange port.
    #[arg(long, default_value_t = 7000)]
    pub port: u16,
    /// The metrics port (Prometheus, and the probes).
    #[arg(long, default_value_t = 9249)]
    pub metrics_port: u16,
    /// The Secret with the object store's keys (`access-key`,
    /// `secret-key`), given to the workers as AWS_ACCESS_KEY_ID and
    /// AWS_SECRET_ACCESS_KEY.
    #[arg(long, default_value = "weir-s3")]
    pub s3_secret: String,
    /// Memory each worker requests (and is limited to): RocksDB's budget
    /// (`state.backend.rocksdb.memory.managed-size` per subtask, 256 MiB
    /// by default) times its subtasks, plus ~256 MiB.
    #[arg(long, default_value = "2Gi")]
    pub memory: String,
    /// CPU each worker requests.
    #[arg(long, default_value = "1")]
    pub cpu: String,
    /// Local disk for RocksDB's working state (an emptyDir: a restarted
    /// pod restores from the checkpoints).
    #[arg(long, default_value = "20Gi")]
    pub disk: String,
    /// Start the job from this savepoint (an upgrade or a rescale: see the
    /// README). Pods restarted later resume from the checkpoints taken
    /// since, not from it again.
    #[arg(long)]
    pub from_savepoint: Option<String>,
}

/// A DNS-1123 label of at most 52 characters (a StatefulSet's pods add
/// `-<index>`, and a controller revision hash).
fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 52
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "--name '{name}': a Kubernetes name is 1 to 52 lowercase letters, digits and '-', starting and ending \
             with a letter or digit"
        ))
    }
}

/// The file's name as a Kubernetes name.
fn default_name(file: &std::path::Path) -> String {
    let stem = file
        .file_stem()
        .map(|s| s.to_string_lossy().to_lowercase())
        .unwrap_or_default();
    let name: String = stem
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let name = name.trim_matches('-').chars().take(52).collect::<String>();
    let name = name.trim_end_matches('-').to_string();
    if name.is_empty() { "weir-job".into() } else { name }
}

/// The manifests, as one YAML stream.
pub fn manifests(args: &ManifestArgs, sql: &str) -> Result<String, String> {
    if args.workers == 0 {
        return Err("--workers 0: a job needs at least one worker".into());
    }
    let name = args.name.clone().unwrap_or_else(|| default_name(&args.file));
    check_name(&name)?;
    check_name(&args.namespace).map_err(|e| e.replace("--name", "--namespace"))?;
    let bounded = match args.kind.as_str() {
        "statefulset" => false,
        "job" => true,
        other => {
            return Err(format!(
                "--kind '{other}': statefulset (an unbounded job) or job (a bounded one)"
            ));
        }
    };
    for (flag, v) in [
        ("--image", &args.image),
        ("--memory", &args.memory),
        ("--cpu", &args.cpu),
        ("--disk", &args.disk),
        ("--s3-secret", &args.s3_secret),
        ("--from-savepoint", args.from_savepoint.as_ref().unwrap_or(&args.image)),
    ] {
        if v.is_empty()
            || v.chars()
                .any(|c| c.is_whitespace() || c == '"' || c == '\\' || c.is_control())
        {
            return Err(format!("{flag} '{v}': no spaces, quotes or backslashes"));
        }
    }
    let ns = &args.namespace;
    let (port, metrics) = (args.port, args.metrics_port);
    let peers: Vec<String> = (0..args.workers)
        .map(|i| format!("{name}-{i}.{name}.{ns}.svc.cluster.local:{port}"))
        .collect();
    let peers = peers.join(",");
    let mut out = String::new();
    out.push_str(&format!(
        "# Generated by `weir k8s manifests {} --workers {}`.\n\
         # Every worker restores from the job's checkpoints: put them on an object store all pods reach\n\
         # (SET 'execution.checkpointing.dir' = 's3://...', and the savepoint dir too), with the keys in\n\
         # the Secret '{}' (access-key, secret-key).\n",
        args.file.display(),
        args.workers,
        args.s3_secret
    ));
    // The SQL, as a literal block (every line indented; nothing in it is
    // YAML syntax then), its indentation given (`|2`: four spaces) so a
    // first line that starts with spaces keeps them.
    out.push_str(&format!(
        "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}-sql\n  namespace: {ns}\n  labels:\n    app.kubernetes.io/name: weir\n    app.kubernetes.io/instance: {name}\ndata:\n  job.sql: |2\n"
    ));
    for line in sql.lines() {
        if line.trim().is_empty() {
            out.push('\n');
        } else {
            out.push_str("    ");
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }
    out.push_str(&format!(
        "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: {ns}\n  labels:\n    app.kubernetes.io/name: weir\n    app.kubernetes.io/instance: {name}\nspec:\n  clusterIP: None\n  # Workers find each other before any is ready.\n  publishNotReadyAddresses: true\n  selector:\n    app.kubernetes.io/instance: {name}\n  ports:\n    - name: exchange\n      port: {port}\n    - name: metrics\n      port: {metrics}\n"
    ));
    // The pod's index: an Indexed Job's completion index, a StatefulSet
    // pod's ordinal (a label since Kubernetes 1.28).
    let index_field = if bounded {
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    } else {
        "metadata.labels['apps.kubernetes.io/pod-index']"
    };
    let mut container = String::from("      terminationGracePeriodSeconds: 120\n");
    if bounded {
        container.push_str(&format!("      restartPolicy: OnFailure\n      subdomain: {name}\n"));
    }
    let lines = [
        "      containers:".to_string(),
        "        - name: worker".to_string(),
        format!("          image: {}", args.image),
        "          args:".to_string(),
        "            - --data-dir=/data".to_string(),
        "            - worker".to_string(),
        "            - --index=$(WEIR_INDEX)".to_string(),
        format!("            - --peers={peers}"),
        format!("            - --listen=0.0.0.0:{port}"),
        format!("            - --metrics-listen=0.0.0.0:{metrics}"),
        args.from_savepoint
            .as_ref()
            .map(|sp| format!("            - --from-savepoint={sp}\n"))
            .unwrap_or_default()
            + "            - /etc/weir/job.sql",
        "          env:".to_string(),
        "            - name: WEIR_INDEX".to_string(),
        "              valueFrom:".to_string(),
        "                fieldRef:".to_string(),
        format!("                  fieldPath: {index_field}"),
        "            - name: AWS_ACCESS_KEY_ID".to_string(),
        "              valueFrom:".to_string(),
        "                secretKeyRef:".to_string(),
        format!("                  name: {}", args.s3_secret),
        "                  key: access-key".to_string(),
        "            - name: AWS_SECRET_ACCESS_KEY".to_string(),
        "              valueFrom:".to_string(),
        "                secretKeyRef:".to_string(),
        format!("                  name: {}", args.s3_secret),
        "                  key: secret-key".to_string(),
        "          ports:".to_string(),
        "            - name: exchange".to_string(),
        format!("              containerPort: {port}"),
        "            - name: metrics".to_string(),
        format!("              containerPort: {metrics}"),
        "          readinessProbe:".to_string(),
        "            httpGet:".to_string(),
        "              path: /metrics".to_string(),
        "              port: metrics".to_string(),
        "            periodSeconds: 5".to_string(),
        "          livenessProbe:".to_string(),
        "            httpGet:".to_string(),
        "              path: /metrics".to_string(),
        "              port: metrics".to_string(),
        "            initialDelaySeconds: 10".to_string(),
        "            periodSeconds: 10".to_string(),
        "            failureThreshold: 6".to_string(),
        "          resources:".to_string(),
        "            requests:".to_string(),
        format!("              cpu: \"{}\"", args.cpu),
        format!("              memory: {}", args.memory),
        "            limits:".to_string(),
        format!("              memory: {}", args.memory),
        "          volumeMounts:".to_string(),
        "            - name: sql".to_string(),
        "              mountPath: /etc/weir".to_string(),
        "            - name: data".to_string(),
        "              mountPath: /data".to_string(),
        "      volumes:".to_string(),
        "        - name: sql".to_string(),
        "          configMap:".to_string(),
        format!("            name: {name}-sql"),
        "        - name: data".to_string(),
        "          emptyDir:".to_string(),
        format!("            sizeLimit: {}", args.disk),
    ];
    for l in lines {
        container.push_str(&l);
        container.push('\n');
    }
    let labels = format!("        app.kubernetes.io/name: weir\n        app.kubernetes.io/instance: {name}\n");
    if bounded {
        out.push_str(&format!(
            "---\napiVersion: batch/v1\nkind: Job\nmetadata:\n  name: {name}\n  namespace: {ns}\n  labels:\n    app.kubernetes.io/name: weir\n    app.kubernetes.io/instance: {name}\nspec:\n  completionMode: Indexed\n  completions: {n}\n  parallelism: {n}\n  # A failed worker is restarted in place (OnFailure); the job recovers.\n  backoffLimit: 60\n  template:\n    metadata:\n      labels:\n{labels}    spec:\n{container}",
            n = args.workers
        ));
    } else {
        out.push_str(&format!(
            "---\napiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: {name}\n  namespace: {ns}\n  labels:\n    app.kubernetes.io/name: weir\n    app.kubernetes.io/instance: {name}\nspec:\n  serviceName: {name}\n  replicas: {n}\n  # Workers start together and wait for each other.\n  podManagementPolicy: Parallel\n  selector:\n    matchLabels:\n      app.kubernetes.io/instance: {name}\n  template:\n    metadata:\n      labels:\n{labels}    spec:\n{container}",
            n = args.workers
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(workers: usize) -> ManifestArgs {
        ManifestArgs {
            file: PathBuf::from("examples/Hot_Items.sql"),
            workers,
            name: None,
            namespace: "default".into(),
            image: "weir:1".into(),
            kind: "statefulset".into(),
            port: 7000,
            metrics_port: 9249,
            s3_secret: "weir-s3".into(),
            memory: "2Gi".into(),
            cpu: "1".into(),
            disk: "20Gi".into(),
            from_savepoint: None,
        }
    }

    #[test]
    fn bad_arguments_are_refused_by_name() {
        assert!(manifests(&args(0), "").expect_err("refused").contains("--workers 0"));
        let mut a = args(2);
        a.name = Some("Bad_Name".into());
        assert!(manifests(&a, "").expect_err("refused").contains("--name 'Bad_Name'"));
        let mut a = args(2);
        a.kind = "deployment".into();
        assert!(manifests(&a, "").expect_err("refused").contains("--kind 'deployment'"));
        let mut a = args(2);
        a.image = "x\"; rm".into();
        assert!(manifests(&a, "").expect_err("refused").contains("--image"));
        let mut a = args(2);
        a.from_savepoint = Some("s3://b/sp 1".into());
        assert!(manifests(&a, "").expect_err("refused").contains("--from-savepoint"));
    }

    #[test]
    fn a_deployment_from_a_savepoint_passes_it_to_every_worker() {
        let mut a = args(2);
        a.from_savepoint = Some("s3://weir/savepoints/savepoint-0a1b".into());
        let y = manifests(&a, "SELECT 1;\n").expect("manifests");
        assert!(
            y.contains(
                "            - --from-savepoint=s3://weir/savepoints/savepoint-0a1b\n            - /etc/weir/job.sql\n"
            ),
            "{y}"
        );
    }

    #[test]
    fn the_name_comes_from_the_file_and_the_peers_from_the_service() {
        let y = manifests(&args(3), "  -- first\nSELECT 1;\n\n  -- x: y\n").expect("manifests");
        assert!(y.contains("name: hot-items\n"), "{y}");
        assert!(y.contains(
            "--peers=hot-items-0.hot-items.default.svc.cluster.local:7000,hot-items-1.hot-items.default.svc.cluster.local:7000,hot-items-2.hot-items.default.svc.cluster.local:7000"
        ));
        // The SQL stays inside its literal block, YAML-looking lines too.
        assert!(
            y.contains("  job.sql: |2\n      -- first\n    SELECT 1;\n\n      -- x: y\n"),
            "{y}"
        );
    }
}
