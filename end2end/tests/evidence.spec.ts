import { test, expect } from "@playwright/test";
import { open, watchConsole } from "./browser";

// Fit evidence and consolidation on the demo fleet, whose sample services use their
// budgets differently (the demo compresses time: ten-second buckets).
test.describe.configure({ mode: "serial" });

test("the service page shows the verdict, the charts, and right-sizes in one step", async ({ page }) => {
  const errors = watchConsole(page);
  await open(page, "/services/reranker");
  // Its tasks want more than their budget: allocations are refused at the limit.
  const summary = page.locator(".fit-summary");
  await expect(summary).toHaveAttribute("data-verdict", "over", { timeout: 60_000 });
  await expect(summary).toContainText("failed at the 3072 MiB limit");
  // Lines of measured use (a flat line has no height: checked by its points), and the budget.
  await expect(page.locator(".chart").first().locator("path.line.s-max")).toHaveAttribute("d", /^M[\d.]+,[\d.]+L/, { timeout: 60_000 });
  await expect(page.locator(".chart .mark.budget").first()).toBeAttached();
  await expect(page.locator(".chart .mark-label.budget").first()).toContainText("budget 3.0 GiB");
  await expect(page.locator(".notice").first()).toContainText("time is compressed");
  await page.getByRole("button", { name: "Day" }).click();
  await expect(page.getByRole("button", { name: "Day" })).toHaveAttribute("aria-pressed", "true");
  await page.getByRole("button", { name: "Right-size…" }).click();
  const diff = page.locator("[data-right-size=proposal]");
  await expect(diff).toBeVisible();
  await expect(diff.locator("tr", { hasText: "containers[0].gpu.mps.memory_mib" }).locator("td.from")).toHaveText("3072");
  await page.screenshot({ path: "screenshots/service-fit.png", fullPage: true });
  await page.getByRole("button", { name: "Register and roll out" }).click();
  await expect(page.getByText(/Registered reranker:2; rolling out/)).toBeVisible();
  const svc = await (await page.request.get("/api/v1/services/reranker")).json();
  expect(svc.task_definition).toBe("reranker:2");
  const def = await (await page.request.get("/api/v1/task-definitions/reranker:2")).json();
  expect(def.spec.containers[0].gpu.mps.memory_mib).toBeGreaterThan(3072);
  expect(errors).toEqual([]);
});

test("the hosts page marks segments whose task is near or over its budget", async ({ page }) => {
  const errors = watchConsole(page);
  await open(page, "/hosts?pool=inference");
  await expect(page.locator('.segment.verdict-near[data-service="embeddings"]').first()).toBeVisible({ timeout: 60_000 });
  const near = page.locator('.segment.verdict-near[data-service="embeddings"]').first();
  await near.focus();
  await expect(page.locator(".segment:focus .tip")).toContainText("near budget");
  await page.screenshot({ path: "screenshots/hosts-verdicts.png", fullPage: true });
  // One host: each GPU's MPS clients, and the daemon's restarts.
  const running = (await (await page.request.get("/api/v1/tasks?service=embeddings&state=running")).json()).tasks;
  await open(page, `/hosts/${running[0].host}`);
  const servers = page.locator("section.mps-servers");
  await expect(servers.getByRole("heading", { name: "Blast radius: MPS servers" })).toBeVisible();
  await expect(servers.locator("[data-mps-restarts]")).toHaveAttribute("data-mps-restarts", "0");
  await expect(servers.locator("tbody tr").first()).toContainText("×");
  // What the host's agent can enforce, each with how or why not (a simulated host: no MPS daemon).
  const enforcement = page.locator("section.enforcement");
  await expect(enforcement.getByRole("heading", { name: "Enforcement" })).toBeVisible();
  await expect(enforcement.locator('tr[data-capability="GPU discovery"]')).toContainText("simulated");
  await expect(enforcement.locator('tr[data-capability="MPS"]')).toHaveAttribute("data-held", "false");
  await expect(enforcement.locator("tbody tr")).toHaveCount(6);
  await page.screenshot({ path: "screenshots/host-mps-servers.png", fullPage: true });
  expect(errors).toEqual([]);
});

test("a consolidation plan frees GPUs, drawn before and after, and runs start before stop", async ({ page }) => {
  const errors = watchConsole(page);
  await open(page, "/consolidation");
  await page.locator("select[name=pool]").selectOption("training");
  await page.locator("select[name=goal]").selectOption("gpus");
  await page.getByRole("button", { name: "Plan" }).click();
  const plan = page.locator("section.plan").first();
  await expect(plan).toHaveAttribute("data-status", "planned");
  await expect(page.locator(".plan-gpu.freed").first()).toBeVisible();
  const moves = await plan.locator("tr.move").count();
  expect(moves).toBeGreaterThan(0);
  await page.getByRole("button", { name: "Show the pool with right-sized budgets" }).click();
  await expect(page.locator(".pool-fit")).toContainText("Pool training with right-sized budgets");
  await page.screenshot({ path: "screenshots/consolidation-plan.png", fullPage: true });
  const id = await plan.getAttribute("data-plan");
  const before = (await (await page.request.get("/api/v1/tasks?service=llm-inference&state=running")).json()).tasks.length;
  await plan.getByRole("button", { name: "Execute" }).click();
  await expect(page.locator(`section.plan[data-plan="${id}"]`)).toHaveAttribute("data-status", "done", { timeout: 80_000 });
  await expect(page.locator("tr.move.state-done")).toHaveCount(moves);
  const after = (await (await page.request.get("/api/v1/tasks?service=llm-inference&state=running")).json()).tasks.length;
  expect(after).toBe(before);
  const done = await (await page.request.get(`/api/v1/consolidation-plans/${id}`)).json();
  const freed: string[] = done.frees_gpus;
  const hosts = (await (await page.request.get("/api/v1/hosts")).json()).hosts;
  for (const name of freed) {
    const [host, gpu] = name.split("/GPU ");
    const h = hosts.find((x: { id: string }) => x.id === host);
    const g = h.gpus.find((x: { index: number }) => x.index === Number(gpu));
    expect(g.sharing_mode).toBe("idle");
  }
  await page.screenshot({ path: "screenshots/consolidation-done.png", fullPage: true });
  expect(errors).toEqual([]);
});
