import { Page, ConsoleMessage, expect } from "@playwright/test";

// The demo server's admin password: playwright.config passes it to the server.
export const ADMIN_PASSWORD = process.env.TESSERA_ADMIN_PASSWORD ?? "e2e-admin-password";
export const BASE_URL = `http://127.0.0.1:${process.env.E2E_PORT ?? 3100}`;

// Errors in the browser console fail a test: hydration problems show up there first.
export function watchConsole(page: Page): string[] {
  const errors: string[] = [];
  page.on("console", (msg: ConsoleMessage) => {
    if (msg.type() === "error") errors.push(msg.text());
  });
  page.on("pageerror", (err) => errors.push(err.message));
  return errors;
}

// Fills in and sends the sign-in form the page shows.
export async function signIn(page: Page, username = "admin", password = ADMIN_PASSWORD) {
  await page.getByLabel("Username").fill(username);
  await page.getByLabel("Password").fill(password);
  await page.getByRole("button", { name: "Sign in" }).click();
  await expect(page.locator(".whoami .user")).toHaveText(username);
}

// Opens a console page, signing in through the page first when it asks, and waits for
// hydration (a click before it would be lost).
export async function open(page: Page, path: string, username = "admin", password = ADMIN_PASSWORD) {
  await page.goto(path);
  if (new URL(page.url()).pathname === "/sign-in") {
    await signIn(page, username, password);
    await expect(page).toHaveURL(new RegExp(path.replace(/[?]/g, "\\?") + "$"));
  }
  await expect(page.locator("main[data-hydrated=true]")).toBeVisible();
}

// Headers of a state-changing API request sent with the page's session cookie: the server
// takes those only from the console's own origin.
export const sameOrigin = { Origin: BASE_URL };
