import { test, expect } from "@playwright/test";
import { open, watchConsole } from "./browser";

test("hosts page shows the demo fleet and filters it after hydration", async ({ page }) => {
  const errors = watchConsole(page);
  await open(page, "/hosts");

  const cards = page.locator(".host-card");
  // Four hosts, and the one the elastic pool's provider made for nightly-batch.
  await expect(cards).toHaveCount(5);
  await expect(page.locator('[data-host^="m-elastic-"] .simulated')).toBeVisible();
  const machines = (await (await page.request.get("/api/v1/pools/elastic/machines")).json()).machines;
  expect(machines).toHaveLength(1);
  expect(machines[0].state).toBe("active");
  expect(machines[0].reason).toContain("2 task(s) of `nightly-batch` wait for 40 GiB of GPU memory; 1 more host(s)");
  // The pool's capacity provider, shown with its hosts.
  await open(page, "/hosts?pool=elastic");
  const provider = page.locator("section.provider");
  await expect(provider.getByRole("heading", { name: "Capacity provider of elastic" })).toBeVisible();
  await expect(provider.locator(".machines-summary")).toHaveText("0 booting · 1 active · 0 terminating");
  await expect(provider.locator('tr[data-state="active"] td.reason')).toContainText("nightly-batch");
  await expect(provider.locator("figure.chart figcaption")).toContainText("Machines");
  await expect(provider.locator("figure.chart path.line.m-active")).toHaveCount(1);
  // An admin changes the provider: a setting that is not a number is named before it is
  // sent, one the server refuses is named by the server, and a good one is saved.
  await provider.getByText("Change the provider").click();
  const form = provider.getByRole("form", { name: "Capacity provider settings" });
  const max = form.getByLabel("Max hosts");
  await max.fill("three");
  await form.getByRole("button", { name: "Save provider" }).click();
  await expect(form.locator(".field-error")).toContainText("must be a whole number");
  await max.fill("0");
  await form.getByRole("button", { name: "Save provider" }).click();
  await expect(form.locator(".field-error")).toContainText("must be between 1 and");
  await max.fill("4");
  await form.getByRole("button", { name: "Save provider" }).click();
  await expect(provider.getByRole("status")).toHaveText("Saved.");
  await expect(provider.locator("p.muted").first()).toContainText("0 to 4 hosts");
  const saved = (await (await page.request.get("/api/v1/pools")).json()).pools.find((p: { name: string }) => p.name === "elastic");
  expect(saved.provider.max_hosts).toBe(4);
  await page.screenshot({ path: "screenshots/hosts-provider.png", fullPage: true });
  // A pool without one offers the form to give it one.
  await open(page, "/hosts?pool=inference");
  await expect(page.locator("section.provider")).toContainText("No capacity provider");
  await expect(page.locator("section.provider summary")).toHaveText("Give this pool a capacity provider");
  await open(page, "/hosts");
  await expect(page.locator('[data-host="sim-h100-1"] .simulated')).toBeVisible();
  await expect(page.locator('[data-host="sim-h100-1"] .gpu')).toHaveCount(8);

  await page.locator("form.filters").getByLabel("Pool").selectOption("inference");
  await expect(cards).toHaveCount(2);
  await expect(page.locator(".filters .count")).toHaveText("2 of 5 hosts");
  await expect(page.locator('[data-host="sim-l4-1"]')).toBeVisible();
  await expect(page.locator('[data-host="sim-h100-1"]')).toHaveCount(0);

  await page.locator("form.filters").getByLabel("Status").selectOption("draining");
  await expect(page.getByText("No host matches these filters.")).toBeVisible();
  await page.locator("form.filters").getByLabel("Status").selectOption("");

  // Adding hosts: an admin mints a join token for a pool, shown once, then listed
  // without its value.
  const panel = page.locator(".join-tokens");
  await panel.getByLabel("Registers in").selectOption("inference");
  await panel.getByLabel("Hosts").fill("3");
  await panel.getByRole("button", { name: "Mint join token" }).click();
  await expect(panel.locator(".minted pre code")).toHaveText(/^[0-9a-f]{64}$/);
  const row = panel.locator(".join-token-list tbody tr");
  await expect(row).toHaveCount(1);
  await expect(row.locator("td").nth(1)).toHaveText("inference");
  await expect(row.locator("td").nth(2)).toHaveText("3");

  // The footer names the servers and the one that schedules.
  const footer = page.getByRole("contentinfo", { name: "Servers" });
  await expect(footer).toContainText("1 server");
  await expect(footer).toContainText("scheduling:");
  await page.screenshot({ path: "screenshots/hosts.png", fullPage: true });
  expect(errors).toEqual([]);
});
