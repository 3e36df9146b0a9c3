//! Paged lists (DESIGN §3): `limit` and `page_token`.

use std::collections::BTreeMap;

use proto::resource::v1::ListResponse;
use tonic::Code;

use super::*;

async fn page(
    h: &Harness,
    limit: u32,
    page_token: &str,
    selector: &str,
) -> Result<ListResponse, Error> {
    h.service
        .list(
            &AllowAll,
            Consistency::Eventual,
            ListRequest {
                r#type: Some(resource::parse_gvk("demo.v2.Artist").expect("gvk")),
                tenancy: Some(tenancy("*", "*")),
                selector: selector.into(),
                limit,
                page_token: page_token.into(),
                ..ListRequest::default()
            },
        )
        .await
}

fn names(list: &ListResponse) -> Vec<String> {
    list.resources
        .iter()
        .map(|r| r.id.as_ref().expect("id").name.clone())
        .collect()
}

#[tokio::test]
async fn pages_hold_at_most_the_limit_and_the_last_has_no_token() {
    let h = harness().await;
    for n in 0..10 {
        h.write(artist(&format!("a-{n:02}"))).await.expect("write");
    }
    let mut seen = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let answer = page(&h, 4, &token, "").await.expect("page");
        assert!(answer.resources.len() <= 4);
        seen.extend(names(&answer));
        pages += 1;
        if answer.next_page_token.is_empty() {
            break;
        }
        token = answer.next_page_token;
        assert!(pages < 10, "the pages do not end");
    }
    assert_eq!(pages, 3);
    let want: Vec<String> = (0..10).map(|n| format!("a-{n:02}")).collect();
    assert_eq!(seen, want);
    // A limit that the listing fits in exactly: one page, no token.
    let whole = page(&h, 10, "", "").await.expect("page");
    assert_eq!(whole.resources.len(), 10);
    assert!(whole.next_page_token.is_empty());
    // No limit: everything, no token.
    let all = page(&h, 0, "", "").await.expect("all");
    assert_eq!(all.resources.len(), 10);
    assert!(all.next_page_token.is_empty());
}

/// Every resource that exists for the whole listing appears exactly once, in key order, while
/// others are created and deleted between the pages.
#[tokio::test]
async fn pages_under_concurrent_writes_hold_every_stable_resource_exactly_once() {
    let h = Arc::new(harness().await);
    for n in 0..40 {
        h.write(artist(&format!("s-{n:02}"))).await.expect("stable");
    }
    let churn = {
        let h = h.clone();
        tokio::spawn(async move {
            for round in 0..60u32 {
                // Names before, between and after the stable ones.
                for prefix in ["a", "s-1", "z"] {
                    let name = format!("{prefix}-churn-{round}");
                    let written = h.write(artist(&name)).await.expect("churn write");
                    if round % 2 == 0 {
                        h.delete(&id_of(&written), "").await.expect("churn delete");
                    }
                }
                tokio::task::yield_now().await;
            }
        })
    };
    let mut count: BTreeMap<String, usize> = BTreeMap::new();
    let mut order = Vec::new();
    let mut token = String::new();
    for _ in 0..200 {
        let answer = page(&h, 7, &token, "").await.expect("page");
        for name in names(&answer) {
            *count.entry(name.clone()).or_default() += 1;
            order.push(name);
        }
        if answer.next_page_token.is_empty() {
            break;
        }
        token = answer.next_page_token;
        tokio::task::yield_now().await;
    }
    churn.await.expect("churn");
    for n in 0..40 {
        let name = format!("s-{n:02}");
        assert_eq!(count.get(&name), Some(&1), "{name}: {count:?}");
    }
    assert!(
        count.values().all(|seen| *seen == 1),
        "a resource appeared twice: {count:?}"
    );
    let mut sorted = order.clone();
    sorted.sort();
    assert_eq!(order, sorted, "pages go in key order");
}

#[tokio::test]
async fn pages_of_a_selection_and_tokens_of_another_listing() {
    let h = harness().await;
    for n in 0..9 {
        let mut resource = artist(&format!("b-{n}"));
        let team = if n % 3 == 0 { "billing" } else { "search" };
        resource.metadata.insert("team".into(), team.into());
        h.write(resource).await.expect("write");
    }
    let first = page(&h, 2, "", "team=billing").await.expect("first");
    assert_eq!(names(&first), ["b-0", "b-3"]);
    let second = page(&h, 2, &first.next_page_token, "team=billing")
        .await
        .expect("second");
    assert_eq!(names(&second), ["b-6"]);
    assert!(second.next_page_token.is_empty());
    // The token with another selector, or a token that is not one: list again.
    expect_error(
        page(&h, 2, &first.next_page_token, "team=search").await,
        Code::InvalidArgument,
        "another selector",
    );
    expect_error(
        page(&h, 2, "garbage!", "").await,
        Code::InvalidArgument,
        "list again from the start",
    );
}
