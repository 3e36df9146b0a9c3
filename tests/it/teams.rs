//! The payments team's journey with the real `resctl` (DESIGN §15, README "Bring your own
//! types"): apply `fixtures/teams` (the Type from its `protoFile`, then invoices of it in the
//! same apply), `types` says who registered it, `explain` prints a field's type and comment, a
//! rule refuses a bad invoice naming the field, `get -o json` shows the default, and deleting
//! the Type with `--wait` removes the invoices and the type.

use crate::cli::{ok, resctl};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_team_registers_its_type_and_uses_it_with_resctl() {
    let cluster = tests::Cluster::start(1).await;
    let server = cluster.nodes[0].api_addr.clone();
    let teams = tests::fixtures().join("teams");
    let applied = ok(&server, &["apply", "-f", &teams.display().to_string()]);
    assert!(applied.contains("4 created"), "{applied}");

    let types: serde_json::Value =
        serde_json::from_str(&ok(&server, &["types", "-o", "json"])).expect("json");
    let invoice = types
        .as_array()
        .expect("a list")
        .iter()
        .find(|t| t["type"] == "payments.v1.Invoice")
        .unwrap_or_else(|| panic!("no invoice type in {types}"));
    assert_eq!(invoice["builtin"], false);
    assert_eq!(invoice["registered_by"], "payments-invoice");

    let explained = ok(&server, &["explain", "payments.v1.Invoice.amount_cents"]);
    assert!(
        explained.contains("amount_cents <int64>")
            && explained.contains("What is owed in all, in cents of `currency`."),
        "{explained}"
    );

    let scratch = tempfile::tempdir().expect("temp dir");
    let bad = scratch.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "type: payments.v1.Invoice\nname: bad\ndata: {customer: \"\", amountCents: \"-5\"}\n",
    )
    .expect("write");
    let refused = resctl(&server, &["apply", "-f", &bad.display().to_string()]);
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("resource.data.amount_cents: amount_cents must not be negative")
            && stderr.contains("resource.data.customer: customer is required"),
        "{stderr}"
    );

    let acme: serde_json::Value = serde_json::from_str(&ok(
        &server,
        &["get", "Invoice", "acme-2026-001", "-o", "json"],
    ))
    .expect("json");
    assert_eq!(acme["data"]["currency"], "EUR", "{acme}");

    ok(
        &server,
        &[
            "delete",
            "registry.v1.Type",
            "payments-invoice",
            "--wait",
            "--timeout",
            "60s",
        ],
    );
    let gone = resctl(&server, &["get", "Invoice"]);
    assert!(!gone.status.success());
    assert!(
        String::from_utf8_lossy(&gone.stderr).contains("no registered type has the kind"),
        "{}",
        String::from_utf8_lossy(&gone.stderr)
    );
}
