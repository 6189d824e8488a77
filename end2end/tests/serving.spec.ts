import { test, expect } from "@playwright/test";
import { open, watchConsole } from "./browser";

// The demo's `embeddings` service is a real HTTP service (tessera example-server on
// dynamic ports, with an HTTP health check): its endpoints answer and its page shows them.
test("the service page lists its endpoints with their health, and they answer", async ({ page }) => {
  const errors = watchConsole(page);
  await open(page, "/services/embeddings");
  const panel = page.locator("section.endpoints");
  await expect(panel.getByRole("heading", { name: "Endpoints" })).toBeVisible();
  // Five tasks, one HTTP port and one metrics port each, all passing their check.
  await expect(panel.locator("tr.endpoint.health-healthy")).toHaveCount(10, { timeout: 60_000 });
  await expect(panel).toContainText("10 of 10 get traffic");
  const list = await (await page.request.get("/api/v1/services/embeddings/endpoints")).json();
  const http = list.endpoints.filter((e: { port_name: string }) => e.port_name === "http");
  expect(http).toHaveLength(5);
  // Each answers on the address and port the list gives.
  for (const e of http) {
    const answer = await page.request.get(`http://${e.address}:${e.port}/`);
    expect(answer.status()).toBe(200);
    expect((await answer.json()).served_by).toBe(e.task);
  }
  // Prometheus finds the metrics ports, labelled.
  const targets = await (await page.request.get("/api/v1/discovery/prometheus")).json();
  const mine = targets.filter((t: { labels: { service: string } }) => t.labels.service === "embeddings");
  // Every running task's metrics port (a draining one's too, while it runs).
  expect(mine.length).toBeGreaterThanOrEqual(5);
  expect(mine[0].labels.revision).toMatch(/^embeddings:\d+$/);
  await page.screenshot({ path: "screenshots/service-endpoints.png", fullPage: true });
  expect(errors).toEqual([]);
});

// The demo's clients send `embeddings` requests; its application's own metrics (scraped
// by the agents) show on its page: the work completed, latency against its target, its
// alarm, and interference as evidence accumulates.
test("the service page shows the work its application completes", async ({ page }) => {
  const errors = watchConsole(page);
  await open(page, "/services/embeddings");
  const panel = page.locator("section.work");
  await expect(panel.getByRole("heading", { name: "Work", exact: true })).toBeVisible();
  await expect(panel.locator("dd.completed")).toHaveText(/^\d+(\.\d)? \/s$/, { timeout: 60_000 });
  await expect(panel).toContainText("example_requests_total");
  await expect(panel.locator(".alarms li")).toContainText("latency_p99_ms above 150 for 30 s");
  const work = await (await page.request.get("/api/v1/services/embeddings/work")).json();
  expect(work.tasks_measured).toBeGreaterThan(0);
  expect(work.completed_per_sec).toBeGreaterThan(0);
  expect(work.objectives.slo.latency_p99_ms).toBe(40);
  await panel.screenshot({ path: "screenshots/service-work.png" });
  expect(errors).toEqual([]);
});
